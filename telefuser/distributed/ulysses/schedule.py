"""The V-first Ulysses exchange that every attention block calls, and the profiler ranges that name its phases.

V leaves first (barrier=False) so that building Q and K hides its transfer; K's scatter completes the group. The
builders are deferred steps so that each model keeps its own order of work inside the same schedule.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.profiler import record_function

from .communicator import UlyssesCommunicator

# Range names that tools read from profiler traces (`telefuser.profiling.overlap`).
PHASE_SCATTER_V = "ulysses.scatter.v"
PHASE_QK_PREP = "ulysses.qk_norm_rope"
PHASE_SCATTER_QK = "ulysses.scatter.qk"
PHASE_ATTENTION = "ulysses.attention"
PHASE_GATHER = "ulysses.gather"

Tensor = torch.Tensor
Step = Callable[[], Tensor]


def v_first(
    comm: UlyssesCommunicator | None,
    v: Step,
    *,
    q: Step | None = None,
    k: Step | None = None,
    qk: Callable[[], tuple[Tensor, Tensor]] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Q, K, V ``[B, S_global, H/W, D]`` (this rank's heads over all rows) from steps that build them as
    ``[B, S_local, H, D]``; without a communicator the same steps run dense.

    Pass either `q` and `k` (separate steps: Q leaves as soon as it is built, so its transfer overlaps building K)
    or `qk` (one step for both: Q and K leave together after it)."""
    separate = qk is None and q is not None and k is not None
    if not separate and (qk is None or q is not None or k is not None):
        raise TypeError("v_first takes either the steps q and k, or the one step qk")
    with record_function(PHASE_SCATTER_V):
        v_out = v()
        v_handle = comm.scatter_heads(v_out, tag="v", barrier=False) if comm is not None else None
    q_handle = None
    with record_function(PHASE_QK_PREP):
        if qk is not None:
            q_out, k_out = qk()
        else:
            q_out = q()
            q_handle = comm.scatter_heads(q_out, tag="q", barrier=False) if comm is not None else None
            k_out = k()
    if comm is None:
        return q_out, k_out, v_out
    with record_function(PHASE_SCATTER_QK):
        if q_handle is None:
            q_handle = comm.scatter_heads(q_out, tag="q", barrier=False)
        k_handle = comm.scatter_heads(k_out, tag="k")
        return q_handle.wait(), k_handle.wait(), v_handle.wait()


def gather_heads(comm: UlyssesCommunicator | None, o: Tensor) -> Tensor:
    """The attention output back to this rank's rows with every head, ``[B, S_local, H, D]``; dense: unchanged."""
    if comm is None:
        return o
    with record_function(PHASE_GATHER):
        return comm.gather_heads(o).wait()


__all__ = [
    "PHASE_ATTENTION",
    "PHASE_GATHER",
    "PHASE_QK_PREP",
    "PHASE_SCATTER_QK",
    "PHASE_SCATTER_V",
    "gather_heads",
    "v_first",
]
