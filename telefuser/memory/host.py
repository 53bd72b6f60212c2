"""Weights that live in host memory and visit the GPU only while they compute.

`to_host` gives a tensor's host copy, page-locked when CUDA is present (copies to the GPU then run at full link
speed and can overlap compute). `HostResident` keeps a whole module's tensors in host memory and lends the module a
device copy for one `with` block (read only: nothing is copied back); `streaming.StreamedLayers` does the same one
layer at a time for a stack too large to lend whole.
"""

from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from torch import nn


def pinning() -> bool:
    """Whether host copies are page-locked: only where a CUDA device exists to copy them to."""
    return torch.cuda.is_available()


# torch's pinned allocator (`pin_memory=True`) rounds every block up to a power of two: weights pinned tensor by
# tensor would take up to twice their size of host memory. Tensors from this size on are pinned in place instead
# (cudaHostRegister on their own pages); smaller ones waste little and use torch's allocator.
REGISTER_FROM_BYTES = 1 << 20


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in host memory, page-locked where CUDA exists (itself when it is there already, pinned); otherwise a
    copy in exactly its size of page-locked memory."""
    if tensor.device.type == "cpu" and (not pinning() or tensor.is_pinned()):
        return tensor
    if not pinning():
        return tensor.to("cpu")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes < REGISTER_FROM_BYTES:
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor)
    return _registered(tensor.shape, tensor.dtype).copy_(tensor)


def _registered(shape, dtype: torch.dtype) -> torch.Tensor:
    """An empty host tensor in memory of its own, page-locked with cudaHostRegister; unregistered when its memory
    goes (the numpy buffer's finalizer runs before numpy frees it, after the last tensor using it is gone)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    buffer = np.empty(nbytes, dtype=np.uint8)  # large: its own mmap'd pages, shared with no other allocation
    pointer = buffer.ctypes.data
    status = torch.cuda.cudart().cudaHostRegister(pointer, nbytes, 0)
    if int(status) != 0:  # not lockable (a limit on locked memory): torch's allocator says why if it cannot either
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    weakref.finalize(buffer, torch.cuda.cudart().cudaHostUnregister, pointer)
    return torch.from_numpy(buffer).view(dtype).view(shape)


def layer_tensors(module: nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, in a fixed order (the order `StreamedLayers` copies them in)."""
    return [*module.parameters(), *(b for b in module.buffers() if b is not None)]


def module_bytes(module: nn.Module | None) -> int:
    """Bytes of a module's parameters and buffers (0 for None)."""
    return 0 if module is None else sum(t.numel() * t.element_size() for t in layer_tensors(module))


class HostResident:
    def __init__(self, module: nn.Module):
        self.module = module
        self._tensors = layer_tensors(module)
        for t in self._tensors:
            t.data = to_host(t.data)

    @contextmanager
    def on(self, device: torch.device | str) -> Iterator[nn.Module]:
        """The module with its tensors on `device` inside the block; back on the host copies afterwards, also after
        an error (the device copies are freed for the caller's later work)."""
        device = torch.device(device)
        host = [t.data for t in self._tensors]
        try:
            for t in self._tensors:
                t.data = t.data.to(device, non_blocking=True)
            yield self.module
        finally:
            for t, h in zip(self._tensors, host):
                t.data = h
