"""Peer buffers in host shared memory: the copy-engine protocol on CPU processes.

Each rank's buffer is a file in /dev/shm mapped by every rank of the group (`torch.from_file(shared=True)`), so a
peer's "destination" is a tensor aliasing the owner's memory. With `HostPrimitives` this runs the whole copy-engine
engine -- target cache, double buffers, epochs, grouped handshake, agreed fallback, timeouts -- on gloo CPU ranks,
which is how CI tests the protocol without a GPU. It is also a working same-host CPU transport.
"""

from __future__ import annotations

import math
import os
import tempfile
import uuid

import torch
import torch.distributed as dist

from ..agreement import gather_from_ranks
from .peer_mapping import PeerBuffers, agree_on_setup, flag_dtype

_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _map(path: str, nbytes: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


class HostSharedMemoryMapping:
    name = "host-shm"

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.rank = dist.get_rank(group)
        self._live: set[str] = set()

    def _allocate_bytes(self, nbytes: int) -> tuple[torch.Tensor, list[torch.Tensor], str]:
        path = os.path.join(_SHM_DIR, f"telefuser-ulysses-{uuid.uuid4().hex}")
        local, peers, error = None, [], None
        try:
            with open(path, "wb") as f:
                f.truncate(nbytes)
            local = _map(path, nbytes)
        except OSError as exc:
            error = f"rank {self.rank} could not create {path}: {exc}"
        paths = gather_from_ranks(None if error else path, self.group)  # every rank joins, failed or not
        if error is None and None not in paths:
            try:
                peers = [local if p == self.rank else _map(path_p, nbytes) for p, path_p in enumerate(paths)]
            except (OSError, RuntimeError) as exc:
                error = f"rank {self.rank} could not map a peer buffer: {exc}"
        try:
            agree_on_setup(error, self.group, "host shared-memory mapping")
        except Exception:
            if os.path.exists(path):
                os.unlink(path)
            raise
        # The agreement above ran after every rank mapped every file: the names can go, the mappings stay valid.
        os.unlink(path)
        return local, peers, path

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> PeerBuffers:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        raw, peers, path = self._allocate_bytes(nbytes)
        self._live.add(path)
        local = raw.view(dtype).view(shape)
        return PeerBuffers(local, peers, nbytes, lambda: self._live.discard(path))

    def allocate_flags(self, bits: int) -> PeerBuffers:
        dtype = flag_dtype(bits)
        world = dist.get_world_size(self.group)
        buffers = self.allocate((world,), dtype)
        buffers.local.zero_()
        dist.barrier(group=self.group)  # nobody publishes before every rank zeroed its flags
        buffers.peers = [p.view(dtype) for p in buffers.peers]
        return buffers

    @property
    def live_buffers(self) -> int:
        return len(self._live)

    def close(self) -> None:
        self._live.clear()
