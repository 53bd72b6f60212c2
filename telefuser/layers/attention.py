"""A DiT self-attention layer with the V-first Ulysses schedule.

fused QKV projection -> submit the strided V view (barrier=False) -> Q/K RMSNorm + RoPE, overlapping V's transfer ->
submit Q (barrier=False) -> submit K (completes the group) -> attention on H/W heads over the whole sequence ->
gather_heads -> output projection. Without a communicator the same module runs dense.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.profiler import record_function

from ..distributed.ulysses import UlyssesCommunicator
from ..ops.attention import attention
from ..ops.rotary import apply_rotary
from ..profiling.overlap import PHASE_QK_PREP, PHASE_SCATTER_V


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
        comm = self.communicator
        if comm is not None:
            with record_function(PHASE_SCATTER_V):
                v_handle = comm.scatter_heads(v, tag="v", barrier=False)
        with record_function(PHASE_QK_PREP):
            q = apply_rotary(self.q_norm(q), cos, sin)
            k = apply_rotary(self.k_norm(k), cos, sin)
        if comm is not None:
            with record_function("ulysses.scatter.qk"):
                q_handle = comm.scatter_heads(q, tag="q", barrier=False)
                k_handle = comm.scatter_heads(k, tag="k")
                q, k, v = q_handle.wait(), k_handle.wait(), v_handle.wait()
        with record_function("ulysses.attention"):
            o = attention(q, k, v, impl=self.attn_impl)
        if comm is not None:
            with record_function("ulysses.gather"):
                o = comm.gather_heads(o).wait()
        return self.out(o.flatten(2))
