"""Peer buffers through legacy CUDA IPC handles (tf-kernel's ipc_* ops); works across processes sharing one GPU.

A peer may still write into an exported buffer after this rank is done with it, so exported memory is released only
at an agreed point (eviction, `reset()`) and a local `close()` parks it until the process exits.
"""

from __future__ import annotations

import math
import threading

import torch

from ...memory.allocator import ipc_shareable_segments
from ..agreement import first_error
from .peer_mapping import FLAG_BANKS, CopyEngineSetupError, PeerBuffers, agreed_step, flag_dtype, short_error

# Exported buffers of closed mappings: a peer may still write into them, so the allocator must not reuse them.
_PARKED: list[torch.Tensor] = []
_PARKED_LOCK = threading.Lock()


def parked_bytes() -> int:
    """Bytes of exported device memory held back from the allocator until exit (closed, not agreed-released)."""
    with _PARKED_LOCK:
        return sum(t.numel() * t.element_size() for t in _PARKED)


class CudaIpcMapping:
    name = "ipc"

    def __init__(self, channel, ops, device: torch.device):
        self.channel = channel
        self.rank = channel.rank
        self.ops = ops
        self.device = device
        self._opened: set[int] = set()
        self._exported: dict[int, torch.Tensor] = {}  # id -> this rank's buffers that peers can write into

    def new_local(self, shape: tuple[int, ...], dtype: torch.dtype, zeroed: bool) -> torch.Tensor:
        """This rank's buffer (the step a test makes fail with an injected out-of-memory), from a segment that a CUDA
        IPC handle can export (the engine turns expandable segments on: memory/allocator.py)."""
        with ipc_shareable_segments():
            if zeroed:
                local = torch.zeros(shape, dtype=dtype, device=self.device)
                torch.cuda.synchronize(self.device)  # zeros are in memory before any peer can publish
                return local
            return torch.empty(shape, dtype=dtype, device=self.device)

    def _share(self, local: torch.Tensor, nbytes: int) -> list[int]:
        error, handle = None, None
        try:
            handle = bytes(self.ops.ipc_get_handle(local).tolist())
        except Exception as exc:
            error = f"rank {self.rank}: could not export an IPC handle: {short_error(exc)}"
        entries = self.channel.gather((error, handle), "setup: CUDA IPC export")
        agreed = first_error([e for e, _ in entries])
        if agreed is not None:
            raise CopyEngineSetupError(f"CUDA IPC export failed: {agreed}")

        def open_all() -> list[int]:
            with torch.cuda.device(self.device):  # the mappings are made on the current device
                return open_on_device()

        def open_on_device() -> list[int]:
            pointers: list[int] = []
            try:
                for p, (_, h) in enumerate(entries):
                    if p == self.rank:
                        pointers.append(local.data_ptr())
                    else:
                        pointers.append(self.ops.ipc_open_handle(torch.tensor(list(h), dtype=torch.uint8), nbytes))
                        self._opened.add(pointers[-1])
            except BaseException:
                self._close_pointers([q for i, q in enumerate(pointers) if i != self.rank])
                raise
            return pointers

        return agreed_step(
            self.channel,
            "CUDA IPC open",
            open_all,
            lambda ptrs: self._close_pointers([q for i, q in enumerate(ptrs) if i != self.rank]),
        )

    def _close_pointers(self, pointers: list[int]) -> None:
        for ptr in pointers:
            if ptr in self._opened:
                self._opened.discard(ptr)
                self.ops.ipc_close_handle(ptr)

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype, zeroed: bool) -> PeerBuffers:
        local = agreed_step(self.channel, "CUDA IPC allocation", lambda: self.new_local(shape, dtype, zeroed))
        nbytes = math.prod(shape) * dtype.itemsize
        pointers = self._share(local, nbytes)  # raises on every rank together; `local` is then simply dropped
        self._exported[id(local)] = local
        opened = [p for i, p in enumerate(pointers) if i != self.rank]

        def release() -> None:  # called at an agreed point only (eviction after a quiesce barrier)
            self._close_pointers(opened)
            self._exported.pop(id(local), None)

        return PeerBuffers(local, pointers, nbytes, release)

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> PeerBuffers:
        return self._allocate(shape, dtype, zeroed=False)

    def allocate_flags(self, bits: int) -> PeerBuffers:
        return self._allocate((FLAG_BANKS * self.channel.world_size,), flag_dtype(bits), zeroed=True)

    @property
    def exported_buffers(self) -> int:
        return len(self._exported)

    def close(self, agreed: bool = False) -> None:
        """Close the handles this rank opened. Exported buffers are dropped when every rank is known to be done with
        them (`agreed`), else parked until the process exits."""
        self._close_pointers(list(self._opened))
        exported, self._exported = list(self._exported.values()), {}
        if not agreed and exported:
            with _PARKED_LOCK:
                _PARKED.extend(exported)
