"""How copy-engine backends obtain peer buffers: the one thing the transports differ in.

A `PeerMapping` allocates, collectively over the group, one buffer per rank and gives every rank an address for each
peer's buffer. The engine only ever sees `PeerBuffers`: its local tensor, one opaque destination per rank (a device
pointer for CUDA, a tensor for host memory) and a `release()` that undoes the local side of the mapping.

Setup is agreed: every rank reports success or its error and all ranks raise the same `CopyEngineSetupError` when
any rank failed, so the communicator can fall back (or refuse) on every rank together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist

from ..agreement import first_error, gather_from_ranks


class CopyEngineSetupError(RuntimeError):
    """Setting up peer buffers failed on at least one rank; raised on every rank."""


@dataclass
class PeerBuffers:
    local: torch.Tensor
    peers: list[Any]  # index p: where this rank writes to reach rank p's buffer (p == rank: the local buffer)
    capacity_bytes: int
    _release: Callable[[], None] | None = field(default=None, repr=False)
    handle: Any = field(default=None, repr=False)  # the Symmetric Memory handle, where the mapping has one

    def release(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release()


class PeerMapping(Protocol):
    name: str

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> PeerBuffers: ...

    def allocate_flags(self, bits: int) -> PeerBuffers: ...

    def close(self) -> None: ...


def agree_on_setup(local_error: str | None, group: dist.ProcessGroup, what: str) -> None:
    """Raise CopyEngineSetupError on every rank if `local_error` is set on any rank."""
    error = first_error(gather_from_ranks(local_error, group))
    if error is not None:
        raise CopyEngineSetupError(f"{what} failed: {error}")


def flag_dtype(bits: int) -> torch.dtype:
    if bits not in (32, 64):
        raise ValueError(f"handshake flags are 32 or 64 bits, got {bits}")
    return torch.int64 if bits == 64 else torch.int32
