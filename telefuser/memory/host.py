"""Weights that live in host memory and visit the GPU only while they compute.

`to_host` gives a tensor's host copy, page-locked when CUDA is present (copies to the GPU then run at full link
speed and can overlap compute). `HostResident` keeps a whole module's tensors in host memory and lends the module a
device copy for one `with` block (read only: nothing is copied back); `streaming.StreamedLayers` does the same one
layer at a time for a stack too large to lend whole.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn


def pinning() -> bool:
    """Whether host copies are page-locked: only where a CUDA device exists to copy them to."""
    return torch.cuda.is_available()


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in host memory, pinned where CUDA exists (itself when it is there already); a device tensor is
    copied once, straight into page-locked memory."""
    if tensor.device.type == "cpu":
        return tensor.pin_memory() if pinning() and not tensor.is_pinned() else tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pinning())
    return host.copy_(tensor)


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
