"""The device memory a launch may plan for: the card's free memory, or what `--gpu-memory-gb` grants.

`--gpu-memory-gb N` stands for a card of N GiB: the plan fills at most `plan.HEADROOM` of it, and the process is held
to N GiB (`torch.cuda.set_per_process_memory_fraction`), so a plan that said it fits is also kept to it. Under
torchrun every rank reads its own device and all of them plan for the smallest (`agreed_budget`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .plan import GIB, HEADROOM


@dataclass(frozen=True)
class DeviceBudget:
    bytes: int  # what a plan may fill
    capacity: int  # the memory the launch treats as its card
    source: str  # for messages and metadata


def device_budget(device, gpu_memory_gb: float | None = None) -> DeviceBudget:
    """This rank's budget on `device` (a torch.device or its name). CUDA: the device's free memory now (before the
    weights load), or `gpu_memory_gb` when given (refused above the free memory). CPU: the host's available memory."""
    import torch

    device = torch.device(device)
    if gpu_memory_gb is not None and gpu_memory_gb <= 0:
        raise ValueError(f"--gpu-memory-gb must be positive, got {gpu_memory_gb:g}")
    if device.type != "cuda":
        capacity = host_available_bytes()
        return DeviceBudget(int(capacity * HEADROOM), capacity, f"{HEADROOM:g} x {capacity / GIB:.1f} GiB host memory")
    free, total = torch.cuda.mem_get_info(device)
    if gpu_memory_gb is None:
        return DeviceBudget(
            int(free * HEADROOM), free, f"{HEADROOM:g} x {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB on {device}"
        )
    capacity = int(gpu_memory_gb * GIB)
    if capacity > free:
        raise ValueError(
            f"--gpu-memory-gb {gpu_memory_gb:g} is more than {device} has free ({free / GIB:.1f} of {total / GIB:.1f} GiB)"
        )
    return DeviceBudget(int(capacity * HEADROOM), capacity, f"{HEADROOM:g} x --gpu-memory-gb {gpu_memory_gb:g}")


def hold_to(device, gpu_memory_gb: float | None) -> None:
    """Keep this process's CUDA allocations on `device` within `gpu_memory_gb` GiB (no-op without it or on a CPU)."""
    import torch

    device = torch.device(device)
    if gpu_memory_gb is None or device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gpu_memory_gb * GIB / total), device)


def agreed_budget(measure: Callable[[], DeviceBudget], group=None) -> DeviceBudget:
    """`measure()` on every rank, then the smallest budget on all of them (one small collective; this rank's own
    without a process group), so that every rank makes the same plan. A rank whose measure fails makes every rank
    raise the same error."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return measure()
    from ..distributed.agreement import first_error, gather_from_ranks

    try:
        mine, error = measure(), None
    except ValueError as exc:
        mine, error = None, str(exc)
    views = gather_from_ranks((mine, error), group)
    message = first_error([e for _, e in views])
    if message is not None:
        raise ValueError(message)
    budgets = [b for b, _ in views]
    smallest = min(range(len(budgets)), key=lambda r: budgets[r].bytes)
    chosen = budgets[smallest]
    if all(b.bytes == chosen.bytes for b in budgets):
        return chosen
    return DeviceBudget(chosen.bytes, chosen.capacity, f"{chosen.source} (rank {smallest}, the smallest)")


def host_budget_bytes() -> int:
    """Pinned host memory one rank may plan for: its share (LOCAL_WORLD_SIZE ranks per host) of HEADROOM x the
    available host memory."""
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return int(host_available_bytes() * HEADROOM) // ranks


def host_available_bytes() -> int:
    """The host memory available now (psutil where installed, else the free page count)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
