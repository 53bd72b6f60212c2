"""Wall-clock timing that is honest on CUDA, and peak-memory readings.

Every boundary synchronizes first, so queued kernels are charged to the phase that launched them.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """``with Stopwatch(device) as sw: ...`` then ``sw.seconds``; waits for queued device work at both ends."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._start


class MemoryPeaks:
    """Peak CUDA memory per stage: ``peaks.mark("denoise")`` records the largest allocated and reserved bytes since
    the previous mark (or the start) under that name, then starts the next stage's count. Nothing on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.allocated: dict[str, int] = {}
        self.reserved: dict[str, int] = {}
        reset_peak_memory(device)

    def mark(self, name: str) -> None:
        if self.device.type != "cuda":
            return
        allocated = int(torch.cuda.max_memory_allocated(self.device))
        reserved = int(torch.cuda.max_memory_reserved(self.device))
        self.allocated[name] = max(self.allocated.get(name, 0), allocated)
        self.reserved[name] = max(self.reserved.get(name, 0), reserved)
        reset_peak_memory(self.device)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"allocated": dict(self.allocated), "reserved": dict(self.reserved)}


class PhaseClock:
    """``clock = PhaseClock(device)`` starts it; ``clock.lap("dit_s")`` records the time since the previous mark, and
    on CUDA the phase's peak memory (`clock.memory`, a `MemoryPeaks`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.phases: dict[str, float] = {}
        synchronize(device)
        self.memory = MemoryPeaks(device)
        self._start = self._mark = time.perf_counter()

    def lap(self, name: str) -> float:
        synchronize(self.device)
        now = time.perf_counter()
        seconds = now - self._mark
        self.phases[name] = self.phases.get(name, 0.0) + seconds
        self.memory.mark(name)
        self._mark = now
        return seconds

    @property
    def total(self) -> float:
        return self._mark - self._start


def cuda_time_ms(fn, warmup: int, iters: int) -> tuple[float, list[float]]:
    """(median, every call's) milliseconds of `fn` on the current CUDA stream, by CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in events]
    return statistics.median(times), times


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): CUDA max_memory_allocated since the reset on GPU, else the process peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is KiB on Linux and bytes on macOS; and it is the peak of the whole process, not of this call.
    return int(rss if sys.platform == "darwin" else rss * 1024), "process_peak_rss"


def device_peaks(device: torch.device) -> dict[str, int]:
    """The largest allocated and reserved CUDA bytes since the last reset (the process start if none); {} on a CPU."""
    if device.type != "cuda":
        return {}
    return {
        "allocated": int(torch.cuda.max_memory_allocated(device)),
        "reserved": int(torch.cuda.max_memory_reserved(device)),
    }
