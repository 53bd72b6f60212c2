"""Wan's attention layers with the released parameter names: self-attention over the whole sequence under the V-first
Ulysses exchange, and cross-attention to the prompt's K/V computed once.

Q and K are RMS-normed over all heads (the full dim) before the exchange, so the exchange carries normed heads; RoPE
and the padding-row cut follow on this rank's heads over every row (`exchange_rope`). Linears run in their weight
dtype; the caller keeps the residual stream in fp32. A model with another self-attention (LingBot's KV window)
subclasses `WanSelfAttention` and keeps `exchange_rope` and `gather_out`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...distributed.ulysses.schedule import PHASE_ATTENTION, Exchange, gather_heads, phase, v_first
from ...ops.attention import attention
from ...ops.fp8 import linear_dtype
from .norms import RMSNorm
from .rope import apply_rope


def run_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return layer(x.to(linear_dtype(layer)))


class ProjectedAttention(nn.Module):
    """The released block's attention parameters: q/k/v/o projections and RMSNorms on Q and K over the full dim (all
    heads)."""

    def __init__(self, dim: int, num_heads: int, eps: float):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps=eps)
        self.norm_k = RMSNorm(dim, eps=eps)


class WanSelfAttention(ProjectedAttention):
    def forward(
        self, x: torch.Tensor, exchange: Exchange, rope: tuple[torch.Tensor, torch.Tensor], rows: int, attn_impl: str
    ) -> torch.Tensor:
        """x ``[B, S_local, dim]`` (this rank's rows, the sequence padded to split evenly) -> ``[B, S_local, dim]``:
        every row attends to the `rows` valid rows of the whole sequence. `rope`: cos, sin ``[rows, D/2]``."""
        q, k, v, padded_rows = self.exchange_rope(x, exchange, rope, rows)
        with phase(PHASE_ATTENTION):
            o = attention(q.to(v.dtype), k.to(v.dtype), v, impl=attn_impl)
        return self.gather_out(o.to(v.dtype), padded_rows, exchange)

    def exchange_rope(self, x: torch.Tensor, comm: Exchange, rope, chunk_rows: int):
        """Q, K, V ``[B, chunk_rows, H_local, D]`` of every rank's rows on this rank's heads, Q and K rotated, and
        the padded row count the exchange carried."""
        b, s, _ = x.shape
        heads = lambda t: t.view(b, s, self.num_heads, self.head_dim)
        q, k, v = v_first(  # V before Q's projection, Q's scatter before K's projection
            comm,
            lambda: heads(run_linear(self.v, x)),
            q=lambda: heads(self.norm_q(run_linear(self.q, x))),
            k=lambda: heads(self.norm_k(run_linear(self.k, x))),
            anchor=x,
        )
        padded_rows, n = q.shape[1], chunk_rows
        q, k, v = q[:, :n], k[:, :n], v[:, :n]  # padding rows neither ask nor answer
        cos, sin = rope
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, padded_rows

    def gather_out(self, o: torch.Tensor, padded_rows: int, comm: Exchange) -> torch.Tensor:
        """Attention output on this rank's heads over every row -> this rank's rows on every head, projected."""
        n = o.shape[1]
        if padded_rows > n:
            o = F.pad(o, (0, 0, 0, 0, 0, padded_rows - n))
        o = gather_heads(comm, o.contiguous())
        return run_linear(self.o, o.flatten(2))


class CachedCrossAttention(ProjectedAttention):
    """Attention from the sequence's rows to the prompt; the prompt's K/V are computed once (`text_kv`)."""

    def text_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context ``[B, L, dim]`` (embedded prompt) -> K, V ``[B, L, H, D]``; all heads (queries are rank-local
        rows with every head, so no exchange is needed)."""
        b, length, _ = context.shape
        k = self.norm_k(run_linear(self.k, context)).view(b, length, self.num_heads, self.head_dim)
        v = run_linear(self.v, context).view(b, length, self.num_heads, self.head_dim)
        return k, v

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], attn_impl: str) -> torch.Tensor:
        b, s, _ = x.shape
        k, v = kv
        q = self.norm_q(run_linear(self.q, x)).view(b, s, self.num_heads, self.head_dim)
        o = attention(q.to(k.dtype), k, v, impl=attn_impl)
        return run_linear(self.o, o.flatten(2))
