"""Causal self-attention over the rolling KV window: Wan's self-attention (`models.wan.attention`: the V-first
exchange, Q/K norms over all heads, RoPE after the scatter) whose keys and values go through the window.

Two entry points share that work: `forward(x, layer, ctx)` is the reference (`KVWindow.window` and the
communicator called directly, as on the CPU), `attend(x, layer_state, chunk)` is what a compiled block region and a
CUDA graph run: tensors and constants only, the window written to device-data slots, the exchange and the attention
kernels as opaque custom ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.profiler import record_function

from ...distributed.ulysses import UlyssesCommunicator
from ...distributed.ulysses.compiled_ops import ExchangeKey, exchange_key
from ...distributed.ulysses.schedule import PHASE_ATTENTION, phase
from ...ops.attention import attention
from ...ops.attention_fp8 import FP8_MAX, fp8_attention_known_scales
from ...ops.attention_sage import quantize_queries, sage_sm90_quantized, window_granularity
from ..wan.attention import WanSelfAttention
from ..wan.norms import RMSNorm
from .kv_cache import KVWindow, LayerState, WindowSlots, write_window


@dataclass
class ChunkContext:
    """What every block of one forward_chunk shares."""

    window: KVWindow
    plan: WindowSlots
    rope: tuple[torch.Tensor, torch.Tensor]  # cos, sin for the chunk's rows (all ranks' rows, in order)
    chunk_rows: int  # valid rows of the chunk; the rank-split sequence may be padded past it
    commit: bool
    communicator: UlyssesCommunicator | None = None
    attn_impl: str = "sdpa"

    def inputs(self) -> ChunkInputs:
        """The same chunk as a block region takes it (the slots as device data, the window length as a CPU tensor)."""
        cos, sin = self.rope
        return ChunkInputs(
            cos,
            sin,
            self.plan.slot_rows(cos.device),
            window_rows(self.plan),
            self.chunk_rows,
            exchange_key(self.communicator),
            self.attn_impl,
            self.plan.kept == 0,
        )


class ChunkInputs(NamedTuple):
    """What every block region of one forward shares: tensors and constants only. Nothing here changes the compiled
    code from chunk to chunk: the slots are device data, the window length a CPU tensor that only the attention op
    reads (`window_rows`), the rest is fixed for a chunk shape and a model."""

    cos: torch.Tensor  # RoPE for the chunk's rows (all ranks' rows, in order) [n, D/2]
    sin: torch.Tensor
    slots: torch.Tensor  # int64 [n] on the device: the buffer row of each chunk row (WindowSlots.slot_rows)
    kv_rows: torch.Tensor  # int64 [1] on the CPU: keys attended, buffer rows [:kv_rows]
    chunk_rows: int  # valid rows of the chunk; the rank-split sequence may be padded past it
    exchange: ExchangeKey | None  # names the communicator (distributed.ulysses.compiled_ops), None dense
    attn_impl: str
    fresh_window: bool  # the chunk rewrites every row it attends (plan.kept == 0): a sage window takes its numbers


def window_rows(plan: WindowSlots) -> torch.Tensor:
    return torch.tensor([plan.total], dtype=torch.int64)


def sage_window_attention(q: torch.Tensor, layer: LayerState, kv_rows: torch.Tensor) -> torch.Tensor:
    """``sage_sm90`` attention of the chunk's queries ``[B, S_q, H, D]`` (bf16/fp16) over the first `kv_rows` rows of
    a window kept in the kernel's layout (kv_cache.py): only Q is quantized here (traced into a block region), with
    the granularity the window's key scales were laid out for; the kernel op cuts the keys and their scales to the
    rows attended."""
    granularity = window_granularity(layer.key_int8_scales, layer.k.shape[1])
    q8, q_scale = quantize_queries(q, granularity)
    return sage_sm90_quantized(
        q8, q_scale, layer.k, layer.key_int8_scales, layer.v, layer.value_scale, out_dtype=q.dtype,
        granularity=granularity, kv_rows=kv_rows,
    )  # fmt: skip


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


class CausalSelfAttention(WanSelfAttention):
    """Wan's self-attention over the rolling KV window: the chunk's K/V go into the window, its queries attend to
    the whole window."""

    def forward(self, x: torch.Tensor, layer: int, ctx: ChunkContext, *, kv_only: bool = False) -> torch.Tensor | None:
        """x ``[B, S_local, dim]`` -> ``[B, S_local, dim]`` (weight dtype); with `kv_only`, None: the chunk's K/V
        reach the window and the attention, whose output nobody reads, is skipped. The reference path."""
        q, k, v, padded_rows = self.exchange_rope(x, ctx.communicator, ctx.rope, ctx.chunk_rows)
        keys, values = ctx.window.window(layer, k, v, ctx.plan, commit=ctx.commit)
        if kv_only:
            return None
        with record_function(PHASE_ATTENTION):
            if ctx.window.sage_window:  # INT8 keys and e4m3 values quantized when written: only Q here
                o = sage_window_attention(q.to(v.dtype), ctx.window.layer_state(layer), window_rows(ctx.plan))
            elif ctx.window.fp8_keys:  # e4m3 keys, V's bound known: no pass over the window to quantize it
                descale_k, amax_v = ctx.window.fp8_scales(layer)
                o = fp8_attention_known_scales(q.to(values.dtype), keys, descale_k, values, amax_v).to(v.dtype)
            else:
                o = attention(q.to(keys.dtype), keys, values, impl=ctx.attn_impl).to(v.dtype)
        return self.gather_out(o, padded_rows, ctx.communicator)

    def attend(
        self, x: torch.Tensor, layer: LayerState, chunk: ChunkInputs, *, kv_only: bool = False
    ) -> torch.Tensor | None:
        """`forward` for a compiled region or a CUDA graph: the same result from the layer's tensors and the chunk's
        inputs (the window written to `chunk.slots`, attention over its first `chunk.kv_rows` rows)."""
        q, k, v, padded_rows = self.exchange_rope(x, chunk.exchange, (chunk.cos, chunk.sin), chunk.chunk_rows)
        write_window(layer, k, v, chunk.slots, chunk.fresh_window)
        if kv_only:
            return None
        with phase(PHASE_ATTENTION):
            if layer.key_mean is not None:
                o = sage_window_attention(q.to(v.dtype), layer, chunk.kv_rows)
            elif layer.key_scale is not None:
                o = fp8_attention_known_scales(
                    q.to(layer.v.dtype), layer.k, layer.key_descale, layer.v, layer.value_amax, kv_rows=chunk.kv_rows
                )
            else:
                o = attention(q.to(layer.k.dtype), layer.k, layer.v, impl=chunk.attn_impl, kv_rows=chunk.kv_rows)
        return self.gather_out(o.to(v.dtype), padded_rows, chunk.exchange)
