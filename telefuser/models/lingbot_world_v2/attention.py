"""Causal self-attention over the rolling KV window: Wan's self-attention (`models.wan.attention`: the V-first
exchange, Q/K norms over all heads, RoPE after the scatter) whose keys and values go through the window.

It runs from the layer's window tensors and the chunk's inputs (`ChunkInputs`): tensors and constants only, the chunk's
K/V written to device-data slots and the window attended by its format (window_formats.py), the exchange and the
attention kernels as opaque custom ops. So the same code runs eagerly, in a compiled block region and in a CUDA graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...distributed.ulysses.schedule import PHASE_ATTENTION, Exchange, phase
from ..wan.attention import WanSelfAttention
from .kv_cache import WindowSlots
from .window_formats import WindowFormat


class ChunkInputs(NamedTuple):
    """What every block region of one forward shares: tensors and constants only. Nothing here changes the compiled
    code from chunk to chunk: the slots are device data, the window length a CPU tensor that only the attention op
    reads (`window_rows`), the rest is fixed for a chunk shape and a model."""

    cos: torch.Tensor  # RoPE for the chunk's rows (all ranks' rows, in order) [n, D/2]
    sin: torch.Tensor
    slots: torch.Tensor  # int64 [n] on the device: the buffer row of each chunk row (WindowSlots.slot_rows)
    kv_rows: torch.Tensor  # int64 [1] on the CPU: keys attended, buffer rows [:kv_rows]
    chunk_rows: int  # valid rows of the chunk; the rank-split sequence may be padded past it
    exchange: Exchange  # the communicator's key (what a region takes: distributed.ulysses.compiled_ops), None dense
    attn_impl: str
    window_format: WindowFormat  # how the window keeps its rows (window_formats.py)
    fresh_window: bool  # the chunk rewrites every row it attends (plan.kept == 0): a sage window takes its numbers


def window_rows(plan: WindowSlots) -> torch.Tensor:
    return torch.tensor([plan.total], dtype=torch.int64)


class CausalSelfAttention(WanSelfAttention):
    """Wan's self-attention over the rolling KV window: the chunk's K/V go into the window, its queries attend to
    the whole window."""

    def forward(
        self, x: torch.Tensor, layer: tuple, chunk: ChunkInputs, *, kv_only: bool = False
    ) -> torch.Tensor | None:
        """x ``[B, S_local, dim]`` -> ``[B, S_local, dim]`` (weight dtype), attending over the first `chunk.kv_rows`
        rows of `layer` (the layer's window state) after writing the chunk's K/V to `chunk.slots`; with `kv_only`,
        None: the chunk's K/V reach the window and the attention, whose output nobody reads, is skipped."""
        q, k, v, padded_rows = self.exchange_rope(x, chunk.exchange, (chunk.cos, chunk.sin), chunk.chunk_rows)
        chunk.window_format.write(layer, k, v, chunk.slots, chunk.fresh_window)
        if kv_only:
            return None
        with phase(PHASE_ATTENTION):
            o = chunk.window_format.attend(q.to(v.dtype), layer, chunk.kv_rows, chunk.attn_impl)
        return self.gather_out(o.to(v.dtype), padded_rows, chunk.exchange)
