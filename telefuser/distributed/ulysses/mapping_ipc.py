"""Peer buffers through legacy CUDA IPC handles (tf-kernel's ipc_* ops).

Each rank allocates its buffer with torch's allocator, exports an IPC handle (plus the buffer's offset inside its
allocation), all ranks exchange the handles over the group, and each opens its peers' handles. This works across
processes that share one GPU too, which is how it is tested on a one-GPU machine. Release closes only the handles this
rank opened; the owner's tensor goes back to torch's allocator.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..agreement import gather_from_ranks
from .peer_mapping import PeerBuffers, agree_on_setup, flag_dtype


class CudaIpcMapping:
    name = "ipc"

    def __init__(self, group: dist.ProcessGroup, ops, device: torch.device):
        self.group = group
        self.rank = dist.get_rank(group)
        self.ops = ops
        self.device = device
        self._opened: set[int] = set()

    def _share(self, local: torch.Tensor) -> list[int]:
        error, handle = None, None
        try:
            handle = bytes(self.ops.ipc_get_handle(local).tolist())
        except RuntimeError as exc:
            error = f"rank {self.rank} could not export an IPC handle: {exc}"
        handles = gather_from_ranks(handle, self.group)  # every rank joins, failed or not
        pointers: list[int] = []
        if error is None and None not in handles:
            try:
                for p, h in enumerate(handles):
                    if p == self.rank:
                        pointers.append(local.data_ptr())
                    else:
                        ptr = self.ops.ipc_open_handle(torch.tensor(list(h), dtype=torch.uint8))
                        self._opened.add(ptr)
                        pointers.append(ptr)
            except RuntimeError as exc:
                error = f"rank {self.rank} could not open a peer's IPC handle: {exc}"
        try:
            agree_on_setup(error, self.group, "CUDA IPC mapping")
        except Exception:
            self._close_pointers([p for i, p in enumerate(pointers) if i != self.rank])
            raise
        return pointers

    def _close_pointers(self, pointers: list[int]) -> None:
        for ptr in pointers:
            if ptr in self._opened:
                self._opened.discard(ptr)
                self.ops.ipc_close_handle(ptr)

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> PeerBuffers:
        local = torch.empty(shape, dtype=dtype, device=self.device)
        pointers = self._share(local)
        peers_opened = [p for i, p in enumerate(pointers) if i != self.rank]
        nbytes = math.prod(shape) * local.element_size()
        return PeerBuffers(local, pointers, nbytes, lambda: self._close_pointers(peers_opened))

    def allocate_flags(self, bits: int) -> PeerBuffers:
        world = dist.get_world_size(self.group)
        local = torch.zeros(world, dtype=flag_dtype(bits), device=self.device)
        torch.cuda.synchronize(self.device)  # zeros are in memory before any peer can publish
        pointers = self._share(local)
        peers_opened = [p for i, p in enumerate(pointers) if i != self.rank]
        return PeerBuffers(local, pointers, local.numel() * local.element_size(), lambda: self._close_pointers(peers_opened))

    def close(self) -> None:
        self._close_pointers(list(self._opened))
