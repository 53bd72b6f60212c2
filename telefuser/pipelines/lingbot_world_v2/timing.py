"""Phase timing with synchronized boundaries: on CUDA every lap waits for the device first, so queued kernels are
charged to the phase that launched them, not to whichever phase happens to block next."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
