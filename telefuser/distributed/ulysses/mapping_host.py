"""Peer buffers in host shared memory (/dev/shm): the copy-engine protocol on gloo CPU ranks.

This is how CI runs the whole engine (cache, double buffers, epochs, handshake, fallback, timeouts) without a GPU;
it is also a working same-host CPU transport.
"""

from __future__ import annotations

import math
import os
import tempfile
import uuid

import torch

from .peer_mapping import FLAG_BANKS, PeerBuffers, agreed_step, flag_dtype

_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _map(path: str, nbytes: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def _unlink(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


class HostSharedMemoryMapping:
    name = "host-shm"

    def __init__(self, channel):
        self.channel = channel
        self.rank = channel.rank
        self._live: set[str] = set()

    def new_local(self, path: str, nbytes: int) -> torch.Tensor:
        """This rank's buffer: a new shared-memory file, mapped (the step a test makes fail)."""
        with open(path, "wb") as f:
            f.truncate(nbytes)
        return _map(path, nbytes)

    def _create(self, path: str, nbytes: int) -> torch.Tensor:
        try:
            return self.new_local(path, nbytes)
        except BaseException:
            _unlink(path)
            raise

    def _allocate_bytes(self, nbytes: int) -> tuple[torch.Tensor, list[torch.Tensor], str]:
        path = os.path.join(_SHM_DIR, f"telefuser-ulysses-{uuid.uuid4().hex}")
        local = agreed_step(
            self.channel, "host shared-memory allocation", lambda: self._create(path, nbytes), lambda _: _unlink(path)
        )
        paths = self.channel.gather(path, "host shared-memory names")
        try:
            peers = agreed_step(
                self.channel,
                "host shared-memory mapping",
                lambda: [local if p == self.rank else _map(path_p, nbytes) for p, path_p in enumerate(paths)],
            )
        finally:
            # Every rank mapped every file (or all gave up together): the names can go, the mappings stay valid.
            _unlink(path)
        return local, peers, path

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> PeerBuffers:
        nbytes = math.prod(shape) * dtype.itemsize
        raw, peers, path = self._allocate_bytes(nbytes)
        self._live.add(path)
        local = raw.view(dtype).view(shape)
        return PeerBuffers(local, peers, nbytes, lambda: self._live.discard(path))

    def allocate_flags(self, bits: int) -> PeerBuffers:
        dtype = flag_dtype(bits)
        world = self.channel.world_size
        buffers = self.allocate((FLAG_BANKS * world,), dtype)
        buffers.local.zero_()
        self.channel.barrier("host flags zeroed")  # nobody publishes before every rank zeroed its flags
        buffers.peers = [p.view(dtype) for p in buffers.peers]
        return buffers

    @property
    def live_buffers(self) -> int:
        return len(self._live)

    def close(self, agreed: bool = False) -> None:
        self._live.clear()
