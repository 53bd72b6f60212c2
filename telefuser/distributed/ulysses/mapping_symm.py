"""Peer buffers through PyTorch Symmetric Memory (torch >= 2.11, one GPU per rank).

`symm_mem.empty` allocates from PyTorch's symmetric pool and `rendezvous` maps every peer's buffer; the engine only
needs the peers' device addresses. PyTorch owns the mappings, so release just drops this rank's references. The flags
come from the same pool and are zeroed, then fenced with a barrier, before any peer may publish into them.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .peer_mapping import PeerBuffers, agree_on_setup, flag_dtype


class SymmetricMemoryMapping:
    name = "symm"

    def __init__(self, group: dist.ProcessGroup, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        self.symm_mem = symm_mem
        self.group = group
        self.rank = dist.get_rank(group)
        self.device = device
        self._live: list[object] = []

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> PeerBuffers:
        error, local, pointers = None, None, []
        try:
            local = self.symm_mem.empty(shape, dtype=dtype, device=self.device)
        except RuntimeError as exc:
            error = f"rank {self.rank} could not allocate symmetric memory: {exc}"
        agree_on_setup(error, self.group, "Symmetric Memory allocation")
        try:
            handle = self.symm_mem.rendezvous(local, group=self.group)
            pointers = [int(p) for p in handle.buffer_ptrs]
        except RuntimeError as exc:
            error = f"rank {self.rank} could not rendezvous: {exc}"
        agree_on_setup(error, self.group, "Symmetric Memory rendezvous")
        self._live.append(local)
        nbytes = math.prod(shape) * local.element_size()
        return PeerBuffers(local, pointers, nbytes, lambda: self._forget(local), handle=handle)

    def _forget(self, tensor: torch.Tensor) -> None:
        self._live = [t for t in self._live if t is not tensor]

    def allocate_flags(self, bits: int) -> PeerBuffers:
        buffers = self.allocate((dist.get_world_size(self.group),), flag_dtype(bits))
        buffers.local.zero_()
        torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)
        return buffers

    def close(self) -> None:
        self._live.clear()
