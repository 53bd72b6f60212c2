"""Weights that live in host memory and visit the GPU only while they compute.

A text encoder runs once per request, the DiT for the rest of it: kept on the GPU, MiniMax H3's encoder (about 50 GB
in bf16) would take that memory from the DiT for the whole request. `HostResident` keeps a module's tensors in
page-locked host memory and lends the module a device copy for one `with` block (read only: nothing is copied back).
"""

from __future__ import annotations

from contextlib import contextmanager
from itertools import chain
from typing import Iterator

import torch
from torch import nn


class HostResident:
    def __init__(self, module: nn.Module):
        self.module = module.to("cpu")
        self._tensors = [t for t in chain(module.parameters(), module.buffers())]
        if torch.cuda.is_available():  # page-locked: the copies to the GPU run at full PCIe/C2C speed
            for t in self._tensors:
                t.data = t.data.pin_memory()

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
