"""Peer buffers through PyTorch Symmetric Memory (torch >= 2.11, one GPU per rank); PyTorch owns the mappings.

The allocation is agreed before anyone enters the collective `rendezvous`, so an out-of-memory on one rank never
leaves its peers inside it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .peer_mapping import FLAG_BANKS, PeerBuffers, agreed_step, flag_dtype


class SymmetricMemoryMapping:
    name = "symm"

    def __init__(self, channel, group: dist.ProcessGroup, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        self.symm_mem = symm_mem
        self.channel = channel
        self.group = group
        self.rank = channel.rank
        self.device = device
        self._live: list[object] = []

    def new_local(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self.symm_mem.empty(shape, dtype=dtype, device=self.device)

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> PeerBuffers:
        local = agreed_step(self.channel, "Symmetric Memory allocation", lambda: self.new_local(shape, dtype))
        handle = agreed_step(
            self.channel, "Symmetric Memory rendezvous", lambda: self.symm_mem.rendezvous(local, group=self.group)
        )
        pointers = [int(p) for p in handle.buffer_ptrs]
        self._live.append(local)
        nbytes = math.prod(shape) * dtype.itemsize
        return PeerBuffers(local, pointers, nbytes, lambda: self._forget(local), handle=handle)

    def _forget(self, tensor: torch.Tensor) -> None:
        self._live = [t for t in self._live if t is not tensor]

    def allocate_flags(self, bits: int) -> PeerBuffers:
        buffers = self.allocate((FLAG_BANKS * self.channel.world_size,), flag_dtype(bits))
        agreed_step(self.channel, "Symmetric Memory flags zeroed", lambda: _zero_and_sync(buffers.local, self.device))
        return buffers

    @property
    def live_buffers(self) -> int:
        return len(self._live)

    def close(self, agreed: bool = False) -> None:
        self._live.clear()


def _zero_and_sync(flags: torch.Tensor, device: torch.device) -> None:
    flags.zero_()
    torch.cuda.synchronize(device)
