"""The V-first Ulysses schedule, and a DiT self-attention layer built on it.

fused QKV projection -> submit the strided V view (barrier=False) -> Q/K RMSNorm + RoPE, overlapping V's transfer ->
submit Q (barrier=False) -> submit K (completes the group) -> attention on H/W heads over the whole sequence ->
gather_heads -> output projection. Without a communicator the same code runs dense. Each phase is a profiler range
(telefuser.profiling.overlap reads them).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.profiler import record_function

from typing import Callable

from ..distributed.ulysses import UlyssesCommunicator
from ..ops.attention import attention
from ..ops.qk_prep import norm_rope
from ..profiling.overlap import PHASE_QK_PREP, PHASE_SCATTER_V


Tensor = torch.Tensor


def v_first_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    comm: UlyssesCommunicator | None,
    prepare_qk: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    attend: Callable[[Tensor, Tensor, Tensor], Tensor],
) -> Tensor:
    """Attention output [B, S_local, H, D] for this rank's rows; q, k, v are [B, S_local, H, D] (views allowed).

    V leaves first, `prepare_qk` (norm + RoPE) runs while it moves, then Q and K follow and K completes the group."""
    if comm is not None:
        with record_function(PHASE_SCATTER_V):
            v_handle = comm.scatter_heads(v, tag="v", barrier=False)
    with record_function(PHASE_QK_PREP):
        q, k = prepare_qk(q, k)
    if comm is not None:
        with record_function("ulysses.scatter.qk"):
            q_handle = comm.scatter_heads(q, tag="q", barrier=False)
            k_handle = comm.scatter_heads(k, tag="k")
            q, k, v = q_handle.wait(), k_handle.wait(), v_handle.wait()
    with record_function("ulysses.attention"):
        o = attend(q, k, v)
    if comm is not None:
        with record_function("ulysses.gather"):
            o = comm.gather_heads(o).wait()
    return o


class UlyssesSelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, head_dim: int, *, eps: float = 1e-6, attn_impl: str = "sdpa"):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim, bias=False)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=eps)
        self.out = nn.Linear(num_heads * head_dim, dim, bias=False)
        self.attn_impl = attn_impl
        self.communicator: UlyssesCommunicator | None = None  # owned by the model, shared by its blocks

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [B, S_local, dim]; cos/sin: rotary tables for this rank's rows [S_local, rotary_dim]."""
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.num_heads, self.head_dim).unbind(2)  # strided views
        o = v_first_attention(
            q, k, v, self.communicator,
            prepare_qk=lambda q, k: (norm_rope(self.q_norm, q, (cos, sin)), norm_rope(self.k_norm, k, (cos, sin))),
            attend=lambda q, k, v: attention(q, k, v, impl=self.attn_impl),
        )
        return self.out(o.flatten(2))
