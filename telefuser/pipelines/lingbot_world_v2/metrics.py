"""Per-chunk measurements -> the session summary the reference's benchmark reports.

Steady compute FPS and the chunk mean / p50 / p90 / max, over the steady chunks (index > 0), defined as the
reference defines them (this folder's README says how, and why only that reading fits its published numbers).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

MEASUREMENT_FIELDS = ("index", "frames", "compute_seconds", "phases")
# A chunk's phases in the order they run; condition_s only when the condition is encoded per chunk.
PHASES = ("condition_s", "dit_s", "kv_update_s", "decode_s", "convert_s")


def seconds_summary(values: Sequence[float]) -> dict[str, float] | None:
    """mean / p50 / p90 / max of `values` with the reference's definitions; None when empty."""
    if not values:
        return None
    ordered = sorted(float(v) for v in values)
    n = len(ordered)
    return {
        "mean": statistics.fmean(ordered),
        "p50": statistics.median(ordered),
        "p90": ordered[int(0.9 * (n - 1))],
        "max": ordered[-1],
    }


def summarize(measurements: Sequence[Mapping]) -> dict:
    """The session summary; steady figures are None when there is no steady chunk (a one-chunk session)."""
    for m in measurements:
        missing = [f for f in MEASUREMENT_FIELDS if f not in m]
        if missing:
            raise ValueError(f"measurement {dict(m)!r} lacks {missing}")
    steady = [m for m in measurements if int(m["index"]) > 0]
    steady_frames = sum(int(m["frames"]) for m in steady)
    steady_seconds = sum(float(m["compute_seconds"]) for m in steady)
    first = [m for m in measurements if int(m["index"]) == 0]
    return {
        "chunks": len(measurements),
        "frames": sum(int(m["frames"]) for m in measurements),
        "compute_seconds": sum(float(m["compute_seconds"]) for m in measurements),
        "first_chunk_seconds": float(first[0]["compute_seconds"]) if first else None,
        "steady_chunks": len(steady),
        "steady_frames": steady_frames,
        "steady_compute_seconds": steady_seconds,
        "steady_compute_fps": steady_frames / steady_seconds if steady and steady_seconds > 0 else None,
        "chunk_seconds": seconds_summary([float(m["compute_seconds"]) for m in steady]),
        "phase_mean_seconds": _phase_means(steady),
        "phase_peak_bytes": _phase_peaks(measurements),
    }


def _phase_peaks(measurements: Sequence[Mapping]) -> dict[str, dict[str, int]]:
    """The largest allocated and reserved CUDA bytes each phase reached in any chunk (empty off CUDA)."""
    out: dict[str, dict[str, int]] = {"allocated": {}, "reserved": {}}
    for m in measurements:
        for kind, phases in (m.get("peak_bytes") or {}).items():
            for phase, value in phases.items():
                out[kind][phase] = max(out[kind].get(phase, 0), int(value))
    return out


def _phase_means(steady: Sequence[Mapping]) -> dict[str, float | None]:
    """Mean seconds of every phase any steady chunk ran (a chunk without it counts 0), so they add up to the mean
    chunk; the known phases come first, in order, each present even without steady chunks (None then)."""
    seen = [p for m in steady for p in m["phases"]]
    names = [p for p in PHASES if p in seen or p != "condition_s"] + sorted(set(seen) - set(PHASES))
    return {p: statistics.fmean(float(m["phases"].get(p, 0.0)) for m in steady) if steady else None for p in names}


def format_summary(summary: Mapping) -> str:
    """One human line per figure, for the CLI."""
    lines = [f"chunks: {summary['chunks']} ({summary['frames']} frames, {summary['compute_seconds']:.3f} s compute)"]
    if summary.get("first_chunk_seconds") is not None:
        lines.append(f"chunk 0: {summary['first_chunk_seconds']:.3f} s")
    fps = summary.get("steady_compute_fps")
    chunk = summary.get("chunk_seconds")
    if fps is None or chunk is None:
        lines.append("steady: no chunk after chunk 0")
    else:
        lines.append(
            f"steady compute FPS: {fps:.2f} over {summary['steady_chunks']} chunks / {summary['steady_frames']} frames"
        )
        lines.append(
            f"steady chunk s: mean {chunk['mean']:.4f} / p50 {chunk['p50']:.4f} / "
            f"p90 {chunk['p90']:.4f} / max {chunk['max']:.4f}"
        )
        phases = summary.get("phase_mean_seconds") or {}
        lines.append("steady phase means: " + ", ".join(f"{k} {v:.4f}" for k, v in phases.items() if v is not None))
    return "\n".join(lines)
