"""The Ulysses exchange as opaque `torch.library` custom ops, so that a compiled block region calls the communicator.

A block compiled as one region (`telefuser.ops.regions`) cannot trace the communicator: its validation, cross-rank
agreement and copy-engine submission are host logic with state. These ops run it eagerly inside the compiled code
(``torch.compiler.is_compiling()`` is False there), in the V-first order of `schedule.v_first`:

- ``ulysses_scatter_deferred(anchor!, x, ...)`` submits one tensor with ``barrier=False`` (V, then Q when it is built
  on its own). It is declared as mutating `anchor`, the tensor the remaining builders read (the block's normed input,
  or a fused QKV projection), and never writes it: the declaration makes the compiler schedule every later reader of
  `anchor` (Q's and K's projections, norms and RoPE) after the submission, so V's transfer overlaps building them,
  and Inductor reuses the buffer in place (no copy). With no `x`, the data is one part of `anchor`
  (``anchor.view(..., parts, -1, head_dim)[..., part, :, :]``: the strided V view of a fused projection, read
  without packing).
- ``ulysses_scatter_complete(k, q?, keep)`` submits K (and Q when it was built with K) with the group's barrier and
  returns the three outputs. `keep` lists the sources submitted earlier: the region keeps them alive, and their
  memory untouched, until the group has completed.
- ``ulysses_gather_heads(o)``: the attention output back to this rank's rows.

A communicator cannot be an op argument. `exchange_key(comm)` names it by an int key, held weakly (as c10d resolves a
process group by name), and its group size; the ops resolve the key at run time and shape their outputs by the size.
A region sees the key as an int input: a model with a new communicator recompiles it once, after which the key is a
dynamic int and later communicators reuse the code. The handles of a group in flight are kept per key between the
ops.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import NamedTuple

import torch

from .communicator import UlyssesCommunicator
from .handles import UlyssesHandle, UlyssesProtocolError

_lock = threading.Lock()
_next_key = itertools.count(1)
_keys: weakref.WeakKeyDictionary[UlyssesCommunicator, int] = weakref.WeakKeyDictionary()
_communicators: weakref.WeakValueDictionary[int, UlyssesCommunicator] = weakref.WeakValueDictionary()
_pending: dict[int, dict[str, UlyssesHandle]] = {}  # key -> this rank's handles of the group being built


class ExchangeKey(NamedTuple):
    """How a compiled region names its communicator."""

    key: int  # resolved to the communicator at run time (`communicator_for`)
    world: int  # its group size: the shapes of the ops' outputs


def exchange_key(comm: UlyssesCommunicator | None) -> ExchangeKey | None:
    """The key the custom ops resolve to `comm` (the same for the communicator's lifetime); None for None."""
    if comm is None:
        return None
    with _lock:
        key = _keys.get(comm)
        if key is None:
            key = _keys[comm] = next(_next_key)
            _communicators[key] = comm
    return ExchangeKey(key, comm.world_size)


def communicator_for(key: int) -> UlyssesCommunicator:
    comm = _communicators.get(key)
    if comm is None:
        raise RuntimeError(
            f"Ulysses exchange key {key} names no live communicator: the model that owned it was closed or dropped"
        )
    return comm


def _fresh(out: torch.Tensor, *inputs: torch.Tensor | None) -> torch.Tensor:
    """The op's output as its fake promises: contiguous (a transport's final layout is, except a portable gather to
    one head per rank, a strided view), and not one of its inputs (a one-rank exchange hands its input back)."""
    out = out.contiguous()
    storage = out.untyped_storage().data_ptr()
    if any(t is not None and t.untyped_storage().data_ptr() == storage for t in inputs):
        return out.clone()
    return out


def _source(anchor: torch.Tensor, x: torch.Tensor | None, part: list[int]) -> torch.Tensor:
    if x is not None:
        return x
    parts, index, head_dim = part
    return anchor.view(*anchor.shape[:-1], parts, -1, head_dim)[..., index, :, :]


def _scattered_shape(x: torch.Tensor, world: int) -> list[int]:
    b, s, h, d = x.shape
    return [b, s * world, h // world, d]


@torch.library.custom_op("telefuser::ulysses_scatter_deferred", mutates_args=("anchor",))
def scatter_deferred(
    anchor: torch.Tensor, x: torch.Tensor | None, key: int, world: int, tag: str, part: list[int]
) -> None:
    """Submit `x` (or `part` of `anchor`) under `tag` with barrier=False; see the module docstring."""
    handle = communicator_for(key).scatter_heads(_source(anchor, x, part), tag=tag, barrier=False)
    with _lock:
        group = _pending.setdefault(key, {})
    if tag in group:  # the communicator refuses a repeated tag first; this is only reached after a reset
        group.clear()
    group[tag] = handle


@scatter_deferred.register_fake
def _(anchor, x, key, world, tag, part):
    return None


@torch.library.custom_op("telefuser::ulysses_scatter_complete", mutates_args=())
def scatter_complete(
    k: torch.Tensor, q: torch.Tensor | None, keep: list[torch.Tensor], key: int, world: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Submit Q (when given) and K, K completing the group; return the scattered (Q, K, V)."""
    comm = communicator_for(key)
    with _lock:
        group = _pending.pop(key, {})
    if q is not None:
        group["q"] = comm.scatter_heads(q, tag="q", barrier=False)
    group["k"] = comm.scatter_heads(k, tag="k")
    missing = {"q", "v"} - set(group)
    if missing:
        raise UlyssesProtocolError(f"ulysses_scatter_complete: no deferred scatter of {sorted(missing)} is pending")
    inputs = (k, q, *keep)
    return tuple(_fresh(group[tag].wait(), *inputs) for tag in ("q", "k", "v"))


@scatter_complete.register_fake
def _(k, q, keep, key, world):
    shape = _scattered_shape(k, world)  # Q, K and V share K's heads (no GQA here)
    return tuple(k.new_empty(shape) for _ in range(3))


@torch.library.custom_op("telefuser::ulysses_gather_heads", mutates_args=())
def gather_heads(o: torch.Tensor, key: int, world: int) -> torch.Tensor:
    """``[B, S_global, H_local, D]`` -> ``[B, S_local, H_local * W, D]``."""
    return _fresh(communicator_for(key).gather_heads(o).wait(), o)


@gather_heads.register_fake
def _(o, key, world):
    b, s, h, d = o.shape
    return o.new_empty([b, s // world, h * world, d])


__all__ = ["ExchangeKey", "communicator_for", "exchange_key", "gather_heads", "scatter_complete", "scatter_deferred"]
