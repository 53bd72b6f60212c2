"""A generic DiT self-attention layer on the V-first Ulysses schedule: the demo's layer and its test's.

Fused QKV, then V leaves while Q and K get their RMSNorm and RoPE; without a communicator it runs dense.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.profiler import record_function

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.schedule import PHASE_ATTENTION, gather_heads, v_first
from telefuser.ops.attention import attention
from telefuser.ops.qk_prep import norm_rope


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
        rope = (cos, sin)
        q, k, v = v_first(
            self.communicator,
            lambda: v,
            qk=lambda: (norm_rope(self.q_norm, q, rope), norm_rope(self.k_norm, k, rope)),
        )
        with record_function(PHASE_ATTENTION):
            o = attention(q, k, v, impl=self.attn_impl)
        return self.out(gather_heads(self.communicator, o).flatten(2))
