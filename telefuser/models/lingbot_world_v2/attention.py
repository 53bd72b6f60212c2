"""Causal self-attention over the rolling KV window, and cross-attention to the prompt's cached K/V.

Self-attention runs the V-first exchange with separate steps (V, then Q and K each projected and normed over all
heads); RoPE, the padding-row cut and the window follow on this rank's heads over every row. Linears run in their
weight dtype; the caller keeps the residual stream in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from ...distributed.ulysses import UlyssesCommunicator
from ...distributed.ulysses.schedule import PHASE_ATTENTION, gather_heads, v_first
from ...ops.attention import attention
from ...ops.attention_fp8 import FP8_MAX, fp8_attention_known_scales
from ...ops.fp8 import linear_dtype
from .kv_cache import KVWindow, WindowPlan
from .norms import RMSNorm
from .rope import apply_rope


@dataclass
class ChunkContext:
    """What every block of one forward_chunk shares."""

    session: KVWindow
    plan: WindowPlan
    rope: tuple[torch.Tensor, torch.Tensor]  # cos, sin for the chunk's rows (all ranks' rows, in order)
    chunk_rows: int  # valid rows of the chunk; the rank-split sequence may be padded past it
    commit: bool
    communicator: UlyssesCommunicator | None = None
    attn_impl: str = "sdpa"


# RMSNorm over n channels leaves |x_i| / rms(x) <= sqrt(n), the learned weight multiplies by at most max |w|, RoPE
# rotates channel pairs (a pair's norm, and so each channel, stays within the bound); the margin covers the three
# bf16 roundings on the way (each <= 2^-8 relatively).
KEY_BOUND_MARGIN = 1.02


def key_scale(norm_k: RMSNorm, dim: int) -> torch.Tensor:
    """The e4m3 scale (fp32 ``[1]``, on the weight's device) that maps the largest key the layer can produce, after
    its RMSNorm over `dim` channels and RoPE, onto 448: a static scale, so a window's keys are cast once when they
    are written and none is ever clipped."""
    bound = norm_k.weight.detach().abs().amax().float() * math.sqrt(dim) * KEY_BOUND_MARGIN
    return (FP8_MAX / bound.clamp_min(1e-12)).reshape(1)


def run_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return layer(x.to(linear_dtype(layer)))


class _ProjectedAttention(nn.Module):
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


class CausalSelfAttention(_ProjectedAttention):
    def forward(self, x: torch.Tensor, layer: int, ctx: ChunkContext, *, kv_only: bool = False) -> torch.Tensor | None:
        """x ``[B, S_local, dim]`` -> ``[B, S_local, dim]`` (weight dtype); with `kv_only`, None: the chunk's K/V
        reach the window and the attention, whose output nobody reads, is skipped."""
        b, s, _ = x.shape
        heads = lambda t: t.view(b, s, self.num_heads, self.head_dim)  # noqa: E731
        comm = ctx.communicator
        q, k, v = v_first(  # V before Q's projection, Q's scatter before K's projection
            comm,
            lambda: heads(run_linear(self.v, x)),
            q=lambda: heads(self.norm_q(run_linear(self.q, x))),
            k=lambda: heads(self.norm_k(run_linear(self.k, x))),
        )
        padded_rows, n = q.shape[1], ctx.chunk_rows
        q, k, v = q[:, :n], k[:, :n], v[:, :n]  # padding rows neither ask nor answer
        cos, sin = ctx.rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = ctx.session.window(layer, k, v, ctx.plan, commit=ctx.commit)
        if kv_only:
            return None
        with record_function(PHASE_ATTENTION):
            if ctx.session.fp8_keys:  # e4m3 keys, V's bound known: no pass over the window to quantize it
                descale_k, amax_v = ctx.session.fp8_scales(layer)
                o = fp8_attention_known_scales(q.to(values.dtype), keys, descale_k, values, amax_v).to(v.dtype)
            else:
                o = attention(q.to(keys.dtype), keys, values, impl=ctx.attn_impl).to(v.dtype)
        if padded_rows > n:
            o = F.pad(o, (0, 0, 0, 0, 0, padded_rows - n))
        o = gather_heads(comm, o.contiguous())
        return run_linear(self.o, o.flatten(2))


class CachedCrossAttention(_ProjectedAttention):
    """Attention from the chunk's rows to the prompt; the prompt's K/V are computed once per session."""

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
