"""How long the V scatter's GPU copies overlapped the Q/K preparation kernels, read from a torch.profiler trace.

The profiler links each CUDA call made on the CPU to the GPU work it started (a shared `correlation` id), so the
GPU intervals of a phase are those started inside its range (`distributed.ulysses.schedule` names the ranges).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..distributed.ulysses.schedule import PHASE_QK_PREP, PHASE_SCATTER_V

_GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


@dataclass(frozen=True)
class Interval:
    start: float  # microseconds, as in the trace
    end: float

    @property
    def length(self) -> float:
        return max(0.0, self.end - self.start)


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for iv in sorted(intervals, key=lambda i: i.start):
        if merged and iv.start <= merged[-1].end:
            merged[-1] = Interval(merged[-1].start, max(merged[-1].end, iv.end))
        else:
            merged.append(iv)
    return merged


def intersection_length(a: list[Interval], b: list[Interval]) -> float:
    total, i, j = 0.0, 0, 0
    a, b = union(a), union(b)
    while i < len(a) and j < len(b):
        lo, hi = max(a[i].start, b[j].start), min(a[i].end, b[j].end)
        total += max(0.0, hi - lo)
        if a[i].end < b[j].end:
            i += 1
        else:
            j += 1
    return total


def gpu_intervals_of_phase(events: list[dict], phase: str) -> list[Interval]:
    """GPU activity started by CUDA runtime calls issued inside every occurrence of the CPU range `phase`."""
    ranges = [
        (e["ts"], e["ts"] + e.get("dur", 0), e.get("tid"))
        for e in events
        if e.get("ph") == "X" and e.get("name") == phase and e.get("cat") in ("user_annotation", "cpu_op")
    ]
    correlations = set()
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("cuda_runtime", "cuda_driver"):  # Triton launches via the driver
            continue
        ts = e["ts"]
        if any(start <= ts <= end and (tid is None or tid == e.get("tid")) for start, end, tid in ranges):
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                correlations.add(corr)
    return [
        Interval(e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in _GPU_CATEGORIES
        and e.get("args", {}).get("correlation") in correlations
    ]


@dataclass
class OverlapReport:
    v_copy_us: float
    qk_prep_us: float
    overlap_us: float

    def summary(self) -> str:
        return (
            f"V copy {self.v_copy_us:.1f} us (GPU busy), Q/K norm+RoPE {self.qk_prep_us:.1f} us, "
            f"overlap {self.overlap_us:.1f} us"
        )


def v_copy_overlap(trace: dict | str | Path) -> OverlapReport:
    """Overlap between the V scatter's copies and the Q/K norm + RoPE kernels in one exported trace."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    events = trace["traceEvents"] if "traceEvents" in trace else trace
    v = gpu_intervals_of_phase(events, PHASE_SCATTER_V)
    qk = gpu_intervals_of_phase(events, PHASE_QK_PREP)
    return OverlapReport(
        v_copy_us=sum(i.length for i in union(v)),
        qk_prep_us=sum(i.length for i in union(qk)),
        overlap_us=intersection_length(v, qk),
    )
