"""Wall-clock timing that is honest on CUDA, and peak-memory readings.

Every boundary synchronizes first, so queued kernels are charged to the phase that launched them.
"""

from __future__ import annotations

import resource
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
