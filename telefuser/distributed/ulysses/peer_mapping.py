"""How copy-engine backends obtain peer buffers: the one thing the transports differ in.

A `PeerMapping` allocates one buffer per rank, collectively, and hands the engine `PeerBuffers` (its tensor, one
destination per peer, `release()`). Every step that can fail runs in `agreed_step`, so all ranks fail together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

T = TypeVar("T")


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


def agree_on_setup(local_error: str | None, channel, what: str) -> None:
    """Raise CopyEngineSetupError on every rank if `local_error` is set on any rank."""
    error = channel.agree(local_error, f"setup: {what}")
    if error is not None:
        raise CopyEngineSetupError(f"{what} failed: {error}")


def short_error(exc: BaseException) -> str:
    """One line for an agreed message (an out-of-memory error carries the allocator's whole report)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def agreed_step(channel, what: str, action: Callable[[], T], undo: Callable[[T], None] | None = None) -> T:
    """Run `action()` on this rank and agree on every rank's outcome before anyone goes on.

    Any exception of the action (an out-of-memory, a CUDA error, a missing operator) becomes this rank's reported
    error; if any rank failed, every rank undoes its own successful action and raises the same CopyEngineSetupError."""
    result, error = None, None
    try:
        result = action()
    except Exception as exc:
        error = f"rank {channel.rank}: {short_error(exc)}"
    agreed = channel.agree(error, f"setup: {what}")
    if agreed is not None:
        if error is None and undo is not None:
            try:
                undo(result)
            except Exception:
                pass
        raise CopyEngineSetupError(f"{what} failed: {agreed}")
    return result


FLAG_BANKS = 2  # the handshake's phases alternate between two banks of world-size slots (copy_engine.py)


def flag_dtype(bits: int) -> torch.dtype:
    if bits not in (32, 64):
        raise ValueError(f"handshake flags are 32 or 64 bits, got {bits}")
    return torch.int64 if bits == 64 else torch.int32
