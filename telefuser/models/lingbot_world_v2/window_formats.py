"""How a KV window keeps its rows: one object per storage format, chosen by the attention backend's `window_format`.

- `PlainWindow`: keys and values in the compute dtype. Every backend reads it (each call quantizes what it needs).
- `Fp8KeyWindow` (``cudnn_fp8``): keys in e4m3, cast once when written with a static per-layer scale (`key_scale`);
  values plain, with a running max |V| over every row written, so FP8 attention casts V with no pass over the window.
- `SageWindow` (``sage_sm90``): INT8 keys and e4m3 values laid out as SageAttention2's SM90 kernel reads them (the
  class docstring); a call quantizes only its queries.

A format does four things, each on a layer's own NamedTuple of tensors: `allocate` a window's buffers, `load` a new
window into pooled ones (graphs.py), `write` a chunk's K/V into its ring slots (`WindowSlots.slot_rows`) and `attend`
the chunk's queries to the window's first `kv_rows` rows. Writes and attention run inside a compiled block region and
a CUDA graph, so they take tensors only (the slots as device data, the window length as a CPU tensor) and copy
through opaque custom ops. A format object holds no tensors: a region takes it as a constant.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ...ops.attention import attention
from ...ops.attention_fp8 import FP8, FP8_MAX, cast_fp8, fp8_attention_known_scales
from ...ops.attention_registry import WINDOW_FP8_KEYS, WINDOW_PLAIN, WINDOW_SAGE_SM90, get_backend
from ...ops.attention_sage import (
    K_BLOCK,
    cast_e4m3,
    default_granularity,
    quantize_key_blocks,
    quantize_queries,
    sage_sm90_quantized,
    value_columns,
)
from ..wan.norms import RMSNorm

Prompt = tuple[torch.Tensor, torch.Tensor]  # one layer's text K/V [B, text_len, H, D]


# -- the copies: opaque inside a compiled region, where they write the window in place ------------------------------
@torch.library.custom_op("telefuser::kv_window_write", mutates_args=("k_cache", "v_cache"))
def _kv_window_write(
    k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        if cache.element_size() == 1:  # e4m3: move the bytes (index_copy_ has no float8 kernels)
            cache, new = cache.view(torch.uint8), new.view(torch.uint8)
        cache.index_copy_(1, slots, new)


@_kv_window_write.register_fake
def _(k_new, v_new, k_cache, v_cache, slots):
    return None


@torch.library.custom_op("telefuser::kv_window_write_sage", mutates_args=("k_cache", "v_cache"))
def _kv_window_write_sage(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    columns: torch.Tensor,
) -> None:
    # bf16 keys by row; e4m3 values [B, H, D, n] by kernel column (the bytes: index_copy_ has no float8 kernels)
    k_cache.index_copy_(1, slots, k_new)
    v_cache.view(torch.uint8).index_copy_(3, columns, v_new.view(torch.uint8))


@_kv_window_write_sage.register_fake
def _(k_new, v_new, k_cache, v_cache, slots, columns):
    return None


@torch.library.custom_op("telefuser::kv_window_write_blocks", mutates_args=("k_cache", "scale_cache"))
def _kv_window_write_blocks(
    k8: torch.Tensor, scales: torch.Tensor, k_cache: torch.Tensor, scale_cache: torch.Tensor, rows: torch.Tensor,
    groups: torch.Tensor,
) -> None:  # fmt: skip
    # whole requantized blocks: int8 key rows, and their scales by kernel group
    k_cache.index_copy_(1, rows, k8)
    scale_cache.index_copy_(2, groups, scales)


@_kv_window_write_blocks.register_fake
def _(k8, scales, k_cache, scale_cache, rows, groups):
    return None


# -- what every format shares -----------------------------------------------------------------------------------------
@dataclass
class WindowBuffers:
    """A window's device memory: every layer's state in `format`. A window allocates its own, or adopts a set that
    outlives it (graphs.py), whose addresses a captured CUDA graph keeps."""

    format: WindowFormat
    layers: list  # one state per layer: the format's NamedTuple
    shape: tuple[int, int, int, int]  # [B, capacity, H_local, D] and the dtype, as asked
    dtype: torch.dtype


class WindowFormat:
    """A storage format: a subclass makes one layer's state (`_new_layer`), resets what a new window must not inherit
    beyond its K/V (`_reset`), and writes and attends."""

    name: str  # the attention backends' `window_format` it answers
    needs_key_scales = False  # each layer's static key scale (`key_scale`), computed by the model

    def allocate(
        self,
        num_layers: int,
        shape: tuple[int, int, int, int],
        cross_kv: list[Prompt],
        key_scales: list[torch.Tensor] | None = None,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> WindowBuffers:
        """Zeroed window buffers of `shape` ``[B, capacity, H_local, D]`` for `num_layers` layers, around the given
        prompt K/V (kept as they are; empty for a window without text) and key scales (`needs_key_scales`)."""
        scales = key_scales or [None] * num_layers
        prompts = cross_kv or [(None, None)] * num_layers
        layers = [self._new_layer(shape, prompts[i], scales[i], device, dtype) for i in range(num_layers)]
        return WindowBuffers(self, layers, tuple(shape), dtype)

    def load(
        self, buffers: WindowBuffers, cross_kv: list[Prompt], key_scales: list[torch.Tensor] | None = None
    ) -> None:
        """Start a new window in `buffers`: its prompt K/V and key scales copied in place, everything else reset, so
        it begins exactly as freshly allocated buffers."""
        scales = key_scales or [None] * len(buffers.layers)
        for layer, (k, v) in zip(buffers.layers, cross_kv):
            layer.cross_k.copy_(k)
            layer.cross_v.copy_(v)
        for layer, scale in zip(buffers.layers, scales):
            layer.k.zero_()
            layer.v.zero_()
            self._reset(layer, scale)

    def _reset(self, layer, key_scale: torch.Tensor | None) -> None:
        pass

    def read_by(self, attn_impl: str) -> bool:
        """A plain window serves every backend; a quantized one only the backends whose format it is."""
        return self.name in (WINDOW_PLAIN, get_backend(attn_impl).window_format)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# -- plain -------------------------------------------------------------------------------------------------------------
class PlainLayer(NamedTuple):
    k: torch.Tensor  # [B, capacity, H_local, D]
    v: torch.Tensor
    cross_k: torch.Tensor  # [B, text_len, H, D]: the prompt's
    cross_v: torch.Tensor


class PlainWindow(WindowFormat):
    name = WINDOW_PLAIN

    def _new_layer(self, shape, prompt: Prompt, key_scale, device, dtype) -> PlainLayer:
        return PlainLayer(
            torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype), *prompt
        )

    def write(self, layer: PlainLayer, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, fresh: bool) -> None:
        """Copy the chunk's K/V ``[B, n, H_local, D]`` into the buffer rows `slots`: the only copy."""
        torch.ops.telefuser.kv_window_write(k, v, layer.k, layer.v, slots)

    def attend(self, q: torch.Tensor, layer: PlainLayer, kv_rows: torch.Tensor, attn_impl: str) -> torch.Tensor:
        return attention(q, layer.k, layer.v, impl=attn_impl, kv_rows=kv_rows)


# -- FP8 keys ----------------------------------------------------------------------------------------------------------
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


class Fp8KeyLayer(NamedTuple):
    k: torch.Tensor  # [B, capacity, H_local, D] e4m3: K * key_scale
    v: torch.Tensor  # [B, capacity, H_local, D] in the compute dtype
    cross_k: torch.Tensor
    cross_v: torch.Tensor
    key_scale: torch.Tensor  # fp32 [1]: the layer's static scale, its reciprocal, the running max |V|
    key_descale: torch.Tensor
    value_amax: torch.Tensor


class Fp8KeyWindow(WindowFormat):
    name = WINDOW_FP8_KEYS
    needs_key_scales = True

    def _new_layer(self, shape, prompt: Prompt, key_scale, device, dtype) -> Fp8KeyLayer:
        scale = key_scale.to(device, torch.float32).reshape(1)
        k = torch.zeros(shape, device=device, dtype=FP8)
        v = torch.zeros(shape, device=device, dtype=dtype)
        return Fp8KeyLayer(k, v, *prompt, scale, scale.reciprocal(), torch.zeros(1, device=device))

    def _reset(self, layer: Fp8KeyLayer, key_scale: torch.Tensor) -> None:
        layer.key_scale.copy_(key_scale.reshape(1))
        torch.reciprocal(layer.key_scale, out=layer.key_descale)
        layer.value_amax.zero_()

    def write(self, layer: Fp8KeyLayer, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, fresh: bool) -> None:
        """The chunk's keys cast once, here, and the running max |V| grown by its rows (no host sync); in a compiled
        region the cast and the reduction fuse into it."""
        k8 = cast_fp8(k, layer.key_scale)
        torch.maximum(layer.value_amax, v.abs().amax().float().reshape(1), out=layer.value_amax)
        torch.ops.telefuser.kv_window_write(k8, v, layer.k, layer.v, slots)

    def attend(self, q: torch.Tensor, layer: Fp8KeyLayer, kv_rows: torch.Tensor, attn_impl: str) -> torch.Tensor:
        # e4m3 keys, V's bound known: no pass over the window to quantize it
        return fp8_attention_known_scales(q, layer.k, layer.key_descale, layer.v, layer.value_amax, kv_rows=kv_rows)


# -- SageAttention2's SM90 layout --------------------------------------------------------------------------------------
WINDOW_VALUE_HEADROOM = 16.0  # e4m3 keeps 3 mantissa bits down to 2^-6 of its range: 16x costs nothing we read
WINDOW_BLOCK_SLACK = 6  # touched blocks beyond new_rows / 128: each of a write's runs (at most 3) may add two
_TINY = 1e-12  # an all-zero channel keeps a finite scale


class SageLayer(NamedTuple):
    k: torch.Tensor  # int8 [B, rows, H_local, D]: rows = capacity rounded up to 128, plus one spare block
    v: torch.Tensor  # e4m3 [B, H_local, D, capacity rounded up to 128], the kernel's columns
    cross_k: torch.Tensor
    cross_v: torch.Tensor
    key_mean: torch.Tensor  # fp32 [B, H, D]: the window's smoothing mean, from its first chunk
    value_scale: torch.Tensor  # fp32 [B, H, D]: e4m3 scale per value channel, from its first chunk
    key_int8_scales: torch.Tensor  # fp32 [B, H, groups]: every key block's scales, the kernel's layout
    key_rows: torch.Tensor  # [B, rows, H, D] in the compute dtype: the keys every write requantizes from


class SageWindow(WindowFormat):
    """A window kept the way SageAttention2's SM90 kernel reads it (ops/attention_sage.py): keys in INT8 with one
    scale per kernel key group, values in e4m3, transposed and permuted to ``[B, H, D, capacity rounded up to 128]``,
    plus the keys in bf16.

    The kernel needs ONE smoothing vector for every key a query sees and ONE e4m3 scale per V channel for the whole
    window, but its key scales are per 128-key block (per_warp) or per interleaved quarter of one (per_thread). A
    window's rows arrive chunk by chunk into ring slots that do not align with the blocks, and a chunk's keys drift
    from the first chunk's (RoPE turns a per-channel offset into one that moves with position). So a window takes from
    its first chunk only the smoothing mean and V's scales (one mean for every key keeps softmax exact: a per-chunk
    mean would shift each chunk's scores by a different ``q . mean``; V with wide headroom: e4m3 is floating), keeps
    its keys in bf16 as well, and on every write requantizes each block the write touched from those bf16 keys, with
    fresh scales: a block's scale always fits the keys in it, however far they drift (a mean that no longer fits costs
    only precision), and a block is quantized once from exact keys, never from its own INT8 values."""

    name = WINDOW_SAGE_SM90

    def _new_layer(self, shape, prompt: Prompt, key_scale, device, dtype) -> SageLayer:
        b, capacity, h, d = shape
        padded = -(-capacity // K_BLOCK) * K_BLOCK  # the kernel reads V in whole 128-key blocks
        rows = padded + K_BLOCK  # and a spare block, where a write's padding entries go (`touched_blocks`)
        groups = rows // K_BLOCK * (4 if default_granularity() == "per_thread" else 1)
        return SageLayer(
            torch.zeros((b, rows, h, d), device=device, dtype=torch.int8),
            torch.zeros((b, h, d, padded), device=device, dtype=FP8),
            *prompt,
            torch.zeros((b, h, d), device=device),
            torch.ones((b, h, d), device=device),
            torch.ones((b, h, groups), device=device),
            torch.zeros((b, rows, h, d), device=device, dtype=dtype),
        )

    def _reset(self, layer: SageLayer, key_scale) -> None:
        layer.key_mean.zero_()
        layer.value_scale.fill_(1.0)
        layer.key_int8_scales.fill_(1.0)
        layer.key_rows.zero_()

    def write(self, layer: SageLayer, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, fresh: bool) -> None:
        """Keys and values quantized with the window's numbers, which a `fresh` write (one that rewrites every row the
        chunk attends, ``plan.kept == 0``: the first chunk's forwards, each rewriting the same rows; the commit's
        clean keys are the last word) takes from its chunk first; rows written once are then read as they are."""
        if fresh:
            mean, v_scale = window_stats(k, v)
            layer.key_mean.copy_(mean)
            layer.value_scale.copy_(v_scale)
        # bf16 keys by row and e4m3 values by kernel column, then every block those rows touched requantized from the
        # bf16 keys (padding entries name the spare block past the window, which no call reads)
        values = window_values(v, layer.value_scale).contiguous()
        torch.ops.telefuser.kv_window_write_sage(k, values, layer.key_rows, layer.v, slots, value_columns(slots))
        blocks = touched_blocks(slots, spare_block=layer.k.shape[1] // K_BLOCK - 1)
        rows = block_rows(blocks)
        granularity = window_granularity(layer.key_int8_scales, layer.k.shape[1])
        k8, scales = window_key_blocks(layer.key_rows.index_select(1, rows), layer.key_mean, granularity)
        torch.ops.telefuser.kv_window_write_blocks(
            k8, scales, layer.k, layer.key_int8_scales, rows, block_groups(blocks, granularity)
        )

    def attend(self, q: torch.Tensor, layer: SageLayer, kv_rows: torch.Tensor, attn_impl: str) -> torch.Tensor:
        """Only Q is quantized here (traced into a block region), with the granularity the window's key scales were
        laid out for; the kernel op cuts the keys and their scales to the rows attended."""
        granularity = window_granularity(layer.key_int8_scales, layer.k.shape[1])
        q8, q_scale = quantize_queries(q, granularity)
        return sage_sm90_quantized(
            q8, q_scale, layer.k, layer.key_int8_scales, layer.v, layer.value_scale, out_dtype=q.dtype,
            granularity=granularity, kv_rows=kv_rows,
        )  # fmt: skip


def window_stats(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From a window's first chunk (``[B, n, H, D]``): (the keys' smoothing mean fp32 ``[B, H, D]``, the e4m3 value
    scale fp32 ``[B, H, D]`` with its headroom)."""
    mean = k.float().mean(dim=1)
    v_scale = v.float().abs().amax(dim=1).clamp_min(_TINY) * (WINDOW_VALUE_HEADROOM / FP8_MAX)
    return mean, v_scale


def window_values(v: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
    """A chunk's values ``[B, n, H, D]`` -> e4m3 ``[B, H, D, n]`` in row order (the write places each row at its
    slot's kernel column, `value_columns`)."""
    return cast_e4m3(v.float(), v_scale[:, None]).permute(0, 2, 3, 1)


def touched_blocks(slots: torch.Tensor, spare_block: int) -> torch.Tensor:
    """The 128-key blocks that the buffer rows `slots` (int64 ``[n]``, runs of consecutive rows) fall in, in order of
    first appearance, padded with `spare_block` to a length that depends on n only (a CUDA graph replays it for any
    plan): int64 ``[ceil(n / 128) + WINDOW_BLOCK_SLACK]``. Device work only, no host sync."""
    block = torch.div(slots, K_BLOCK, rounding_mode="floor")
    starts = torch.ones_like(block, dtype=torch.bool)
    starts[1:] = block[1:] != block[:-1]
    index = starts.cumsum(0) - 1  # rows of one block share its index; a block met again in a later run gets a new one
    length = -(-slots.shape[0] // K_BLOCK) + WINDOW_BLOCK_SLACK
    return torch.full((length,), spare_block, dtype=torch.int64, device=slots.device).scatter(0, index, block)


def block_rows(blocks: torch.Tensor) -> torch.Tensor:
    """Every buffer row of `blocks`, block by block: int64 ``[len(blocks) * 128]``."""
    return (blocks[:, None] * K_BLOCK + torch.arange(K_BLOCK, device=blocks.device)).flatten()


def block_groups(blocks: torch.Tensor, granularity: str) -> torch.Tensor:
    """The kernel's key-scale index of every group in `blocks` (4 per block per_thread, 1 per_warp)."""
    per_block = 4 if granularity == "per_thread" else 1
    return (blocks[:, None] * per_block + torch.arange(per_block, device=blocks.device)).flatten()


def window_key_blocks(keys: torch.Tensor, mean: torch.Tensor, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole blocks of a window's bf16 keys ``[B, T * 128, H, D]`` -> (int8 keys, smoothed by the window's `mean`,
    same shape; their fresh scales fp32 ``[B, H, T * groups per block]``, block by block as `block_groups`)."""
    return quantize_key_blocks(keys.float() - mean[:, None], granularity)


def window_granularity(k_scale: torch.Tensor, k_rows: int) -> str:
    """The granularity a window's key-scale buffer ``[B, H, groups]`` was laid out for, over `k_rows` buffer rows."""
    return "per_thread" if k_scale.shape[-1] == 4 * (k_rows // K_BLOCK) else "per_warp"


# -- which format a backend gets --------------------------------------------------------------------------------------
PLAIN_WINDOW, FP8_KEY_WINDOW, SAGE_WINDOW = PlainWindow(), Fp8KeyWindow(), SageWindow()
FORMATS = {f.name: f for f in (PLAIN_WINDOW, FP8_KEY_WINDOW, SAGE_WINDOW)}
SAGE_WINDOW_ENV = "TELEFUSER_SAGE_WINDOW"


def sage_window_wanted() -> bool:
    """Whether a ``sage_sm90`` KV window is kept quantized for the kernel, the default, or a bf16 window that each
    call quantizes whole (``TELEFUSER_SAGE_WINDOW=0``: a pass over the window per call, for comparing the two)."""
    value = os.environ.get(SAGE_WINDOW_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{SAGE_WINDOW_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def format_for(attn_impl: str) -> WindowFormat:
    """The format a window made for attention backend `attn_impl` keeps (the backend record's `window_format`)."""
    window_format = FORMATS[get_backend(attn_impl).window_format]
    if window_format is SAGE_WINDOW and not sage_window_wanted():
        return PLAIN_WINDOW
    return window_format
