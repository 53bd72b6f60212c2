"""The V-first Ulysses exchange that every attention block calls, and the profiler ranges that name its phases.

V leaves first (barrier=False) so that building Q and K hides its transfer; K's scatter completes the group. The
builders are deferred steps so that each model keeps its own order of work inside the same schedule.

A model whose blocks run as compiled regions passes its communicator's `compiled_ops.exchange_key` instead of the
communicator, and the tensor its remaining builders read as `anchor`: the exchange then runs through
the custom ops of `compiled_ops`, eagerly inside the compiled code, in the same order.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.profiler import record_function

from . import compiled_ops
from .communicator import UlyssesCommunicator

# Range names that tools read from profiler traces (`telefuser.profiling.overlap`).
PHASE_SCATTER_V = "ulysses.scatter.v"
PHASE_QK_PREP = "ulysses.qk_norm_rope"
PHASE_SCATTER_QK = "ulysses.scatter.qk"
PHASE_ATTENTION = "ulysses.attention"
PHASE_GATHER = "ulysses.gather"

Tensor = torch.Tensor
Step = Callable[[], Tensor]
Exchange = UlyssesCommunicator | compiled_ops.ExchangeKey | None  # the communicator, its key, or None (dense)


def phase(name: str):
    """The profiler range `name` around eager work; nothing inside a compiled region (it has no host range per phase,
    and dynamo would drop one with a warning)."""
    return contextlib.nullcontext() if torch.compiler.is_compiling() else record_function(name)


def v_first(
    comm: Exchange,
    v: Step,
    *,
    q: Step | None = None,
    k: Step | None = None,
    qk: Callable[[], tuple[Tensor, Tensor]] | None = None,
    anchor: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Q, K, V ``[B, S_global, H/W, D]`` (this rank's heads over all rows) from steps that build them as
    ``[B, S_local, H, D]``; without a communicator the same steps run dense.

    Pass either `q` and `k` (separate steps: Q leaves as soon as it is built, so its transfer overlaps building K)
    or `qk` (one step for both: Q and K leave together after it). With an exchange key, `anchor` is the tensor the
    Q and K steps read (see the module docstring)."""
    separate = qk is None and q is not None and k is not None
    if not separate and (qk is None or q is not None or k is not None):
        raise TypeError("v_first takes either the steps q and k, or the one step qk")
    if isinstance(comm, compiled_ops.ExchangeKey):
        if anchor is None:
            raise TypeError("v_first with an exchange key needs the anchor its Q and K steps read")
        return _v_first_ops(comm, v, q, k, qk, anchor)
    with phase(PHASE_SCATTER_V):
        v_out = v()
        v_handle = comm.scatter_heads(v_out, tag="v", barrier=False) if comm is not None else None
    q_handle = None
    with phase(PHASE_QK_PREP):
        if qk is not None:
            q_out, k_out = qk()
        else:
            q_out = q()
            q_handle = comm.scatter_heads(q_out, tag="q", barrier=False) if comm is not None else None
            k_out = k()
    if comm is None:
        return q_out, k_out, v_out
    with phase(PHASE_SCATTER_QK):
        if q_handle is None:
            q_handle = comm.scatter_heads(q_out, tag="q", barrier=False)
        k_handle = comm.scatter_heads(k_out, tag="k")
        return q_handle.wait(), k_handle.wait(), v_handle.wait()


def _v_first_ops(comm, v: Step, q, k, qk, anchor: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    key, world = comm
    with phase(PHASE_SCATTER_V):
        v_out = v()
        compiled_ops.scatter_deferred(anchor, v_out, key, world, "v", [])
    with phase(PHASE_QK_PREP):
        if qk is not None:
            q_out, k_out = qk()
            keep = [v_out]
        else:
            q_out = q()
            compiled_ops.scatter_deferred(anchor, q_out, key, world, "q", [])
            k_out = k()
            keep, q_out = [v_out, q_out], None
    with phase(PHASE_SCATTER_QK):
        return compiled_ops.scatter_complete(k_out, q_out, keep, key, world)


def v_first_fused(
    comm: Exchange, qkv: Tensor, head_dim: int, qk: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor, Tensor]:
    """`v_first` for a fused projection ``qkv [B, S_local, 3 * H * D]`` (Q, K, V in that order): V leaves as its
    strided view, with no packing copy, then ``qk(q_view, k_view)`` builds Q and K, which leave together."""
    b, s, _ = qkv.shape
    views = lambda t: t.view(b, s, 3, -1, head_dim).unbind(2)  # noqa: E731
    if not isinstance(comm, compiled_ops.ExchangeKey):
        q, k, v = views(qkv)
        return v_first(comm, lambda: v, qk=lambda: qk(q, k))
    key, world = comm
    with phase(PHASE_SCATTER_V):
        compiled_ops.scatter_deferred(qkv, None, key, world, "v", [3, 2, head_dim])
    with phase(PHASE_QK_PREP):
        q, k, _ = views(qkv)  # read after the submission: the op is declared as writing qkv
        q_out, k_out = qk(q, k)
    with phase(PHASE_SCATTER_QK):
        return compiled_ops.scatter_complete(k_out, q_out, [qkv], key, world)


def gather_heads(comm: Exchange, o: Tensor) -> Tensor:
    """The attention output back to this rank's rows with every head, ``[B, S_local, H, D]``; dense: unchanged."""
    if comm is None:
        return o
    with phase(PHASE_GATHER):
        if isinstance(comm, compiled_ops.ExchangeKey):
            return compiled_ops.gather_heads(o, *comm)
        return comm.gather_heads(o).wait()


__all__ = [
    "PHASE_ATTENTION",
    "PHASE_GATHER",
    "PHASE_QK_PREP",
    "PHASE_SCATTER_QK",
    "PHASE_SCATTER_V",
    "gather_heads",
    "phase",
    "v_first",
    "v_first_fused",
]
