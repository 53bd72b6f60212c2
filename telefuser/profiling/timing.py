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


class PhaseClock:
    """``clock = PhaseClock(device)`` starts it; ``clock.lap("dit_s")`` records the time since the previous mark."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.phases: dict[str, float] = {}
        synchronize(device)
        self._start = self._mark = time.perf_counter()

    def lap(self, name: str) -> float:
        synchronize(self.device)
        now = time.perf_counter()
        seconds = now - self._mark
        self.phases[name] = self.phases.get(name, 0.0) + seconds
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
