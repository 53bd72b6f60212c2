"""How much memory a service may promise to requests: read once at start-up, after the model is loaded.

On CUDA, what new tensors of this process can still get: the device's free memory plus what torch's caching allocator
holds unused (the weights are already resident; a warm-up's freed activations stay reserved by the allocator, and
the device calls them used). On a CPU, the host's available memory. A tenth is kept back for the allocator's
fragmentation and the service itself. Each request is checked against its own
estimate from the model adapter, so one that cannot fit is refused with a 422 instead of taking the process down.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

HEADROOM = 0.9
GIB = 1 << 30


@dataclass(frozen=True)
class MemoryBudget:
    bytes: int
    source: str  # what was measured, for /v1/service/metadata


def available_memory(device: str | None) -> MemoryBudget:
    """HEADROOM x the memory `device` ("cuda", "cuda:1", "cpu", None = cpu) can still give this process."""
    if device and str(device).startswith("cuda"):
        import torch

        index = torch.device(device)
        free, total = torch.cuda.mem_get_info(index)
        cached = max(0, torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index))
        return MemoryBudget(
            int((free + cached) * HEADROOM),
            f"{HEADROOM:g} x memory of {device} free at start-up ({free / GIB:.1f} GiB free + {cached / GIB:.1f} GiB "
            f"cached by torch, of {total / GIB:.1f} GiB)",
        )
    free = _host_available()
    return MemoryBudget(
        int(free * HEADROOM), f"{HEADROOM:g} x available host memory at start-up ({free / GIB:.1f} GiB)"
    )


def _host_available() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil arrives with accelerate; the page count is the fallback
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def gib(value: float | None) -> int | None:
    return None if value is None else int(value * GIB)
