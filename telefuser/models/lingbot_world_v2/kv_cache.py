"""`KVWindow`: one stream's rolling self-attention KV per layer (sink + newest frames), its text K/V and frame cursor.

The buffers are allocated once and never move. Each holds the sink rows, then a ring of the other rows, so a chunk
(read-only step or commit) copies only its own rows, into the slots of the rows it evicts or after the committed ones,
and attends to a prefix of the buffer: no scratch, no roll. The layout and the rules are in this folder's README.

For a compiled block region (and a CUDA graph) the window is tensors only: `LayerState` holds a layer's buffers,
`WindowSlots.slot_rows` gives the chunk's slots as device data, and `write_window` copies the chunk's rows there
through the opaque custom op ``telefuser::kv_window_write``. A window may adopt `WindowBuffers` that outlive it
(graphs.py pools them).

A window made for ``sage_sm90`` attention (`sage_window`) is kept the way SageAttention2's SM90 kernel reads
it (ops/attention_sage.py): keys in INT8 ``[B, rows, H, D]`` with one scale per kernel key group, values in e4m3,
transposed and permuted to ``[B, H, D, capacity rounded up to 128]``, plus the keys in bf16. The window takes the
keys' smoothing mean and the values' scales from its first chunk (one mean for every key keeps softmax exact: a per-chunk
mean would shift each chunk's scores by a different ``q . mean``). Every write copies the chunk's bf16 keys in and
requantizes, with fresh scales, each 128-key block its rows touched (ring slots do not align with blocks), so a
block's scale always fits its keys, however they drift. A chunk's call then quantizes only its queries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ...ops.attention_fp8 import FP8, cast_fp8
from ...ops.attention_sage import (
    K_BLOCK,
    block_groups,
    block_rows,
    default_granularity,
    touched_blocks,
    value_columns,
    window_granularity,
    window_key_blocks,
    window_stats,
    window_values,
)


class WindowError(RuntimeError):
    """A KV window used in a way it cannot serve (closed, wrong shape, wrong parallel degree)."""


@dataclass(frozen=True)
class WindowSlots:
    """Which rows one chunk attends to and where its own rows go; the same for every layer of one forward."""

    capacity: int
    sink_rows: int
    committed: int  # rows committed before this chunk
    new_rows: int
    ring_head: int = 0  # ring slot (counted from sink_rows) of the oldest non-sink row; 0 until the window is full

    @property
    def evicted(self) -> int:
        return max(0, self.committed + self.new_rows - self.capacity)

    @property
    def head_rows(self) -> int:
        """Leading committed rows that always stay: the sink (or all rows while fewer are committed)."""
        return min(self.sink_rows, self.committed)

    @property
    def kept(self) -> int:
        return self.committed - self.evicted

    @property
    def total(self) -> int:
        """Keys the chunk attends to (buffer rows ``[:total]``), and the committed rows after a commit."""
        return self.kept + self.new_rows

    @property
    def ring_rows(self) -> int:
        return self.capacity - self.sink_rows

    @property
    def slots(self) -> tuple[tuple[int, int, int], ...]:
        """Where the chunk's rows go: ``(first buffer row, first chunk row, rows)`` per contiguous run, at most two.

        The first ``new_rows - evicted`` rows are appended after the committed ones; the other `evicted` rows take,
        in order, the ring slots of the oldest non-sink rows from `ring_head` on, wrapping at the ring's end. Appending
        happens only while the window is not full, when `ring_head` is 0 and the evicted slots cannot wrap."""
        appended, evicted = self.new_rows - self.evicted, self.evicted
        runs = []
        if appended:
            runs.append((self.committed, 0, appended))
        if evicted:
            first = min(evicted, self.ring_rows - self.ring_head)
            runs.append((self.sink_rows + self.ring_head, appended, first))
            if evicted > first:  # the chunk's slots wrap past the ring's end
                runs.append((self.sink_rows, appended + first, evicted - first))
        return tuple(runs)

    def slot_rows(self, device: torch.device | str) -> torch.Tensor:
        """`slots` as device data: the buffer row of each chunk row, int64 ``[new_rows]`` (for `write_window`)."""
        return torch.cat([torch.arange(row, row + rows, device=device) for row, _, rows in self.slots])


@dataclass
class LayerKV:
    k: torch.Tensor
    v: torch.Tensor


class LayerState(NamedTuple):
    """One layer's window tensors, all a block region reads or writes of the window (no layer index, no plan)."""

    k: torch.Tensor  # [B, capacity, H_local, D] window keys (e4m3 for FP8 keys)
    v: torch.Tensor  # [B, capacity, H_local, D] window values
    cross_k: torch.Tensor  # [B, text_len, H, D] the prompt's keys
    cross_v: torch.Tensor
    key_scale: torch.Tensor | None  # FP8 keys: the static scale, its reciprocal, the running max |V| (fp32 [1])
    key_descale: torch.Tensor | None
    value_amax: torch.Tensor | None
    # A sage_sm90 window (k int8 [B, rows, H, D], rows = capacity rounded up to 128 plus one spare block; v e4m3
    # [B, H_local, D, capacity rounded up to 128]): the window's numbers, taken from a forward that rewrites every
    # row it attends (key mean fp32 [B, H, D], e4m3 value scale fp32 [B, H, D]), the INT8 key scales fp32
    # [B, H, groups] and the keys in bf16 [B, rows, H, D], from which every write requantizes the blocks it touched
    key_mean: torch.Tensor | None = None
    value_scale: torch.Tensor | None = None
    key_int8_scales: torch.Tensor | None = None
    key_rows: torch.Tensor | None = None


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


def _write_sage_window(
    layer: LayerState, k_new: torch.Tensor, v_new: torch.Tensor, slots: torch.Tensor, fresh: bool
) -> None:
    # The window's numbers come from a forward that rewrites every row it attends (`fresh`: the first chunk's
    # forwards, each rewriting the same rows; the commit's clean keys are the last word) and stay for every later
    # write: rows written once are read as they are.
    if fresh:
        mean, v_scale = window_stats(k_new, v_new)
        layer.key_mean.copy_(mean)
        layer.value_scale.copy_(v_scale)
    # bf16 keys by row and e4m3 values by kernel column, then every block those rows touched requantized from the
    # bf16 keys (padding entries name the spare block past the window, which no call reads)
    values = window_values(v_new, layer.value_scale).contiguous()
    torch.ops.telefuser.kv_window_write_sage(k_new, values, layer.key_rows, layer.v, slots, value_columns(slots))
    blocks = touched_blocks(slots, spare_block=layer.k.shape[1] // K_BLOCK - 1)
    rows = block_rows(blocks)
    granularity = window_granularity(layer.key_int8_scales, layer.k.shape[1])
    k8, scales = window_key_blocks(layer.key_rows.index_select(1, rows), layer.key_mean, granularity)
    torch.ops.telefuser.kv_window_write_blocks(
        k8, scales, layer.k, layer.key_int8_scales, rows, block_groups(blocks, granularity)
    )


def write_window(
    layer: LayerState, k_new: torch.Tensor, v_new: torch.Tensor, slots: torch.Tensor, fresh: bool = False
) -> None:
    """Copy the chunk's K/V ``[B, new_rows, H_local, D]`` into the buffer rows `slots` (`WindowSlots.slot_rows`): the
    only copy. FP8 keys are cast once, here, and the layer's running max |V| grows with the rows it is given (no host
    sync); a sage_sm90 window quantizes keys and values here with the window's numbers, which a `fresh` write (one
    that rewrites every row the chunk attends: ``plan.kept == 0``) takes from its chunk first. In a compiled region
    the casts and the reductions fuse into it; the copy is an opaque op."""
    if layer.key_mean is not None:
        _write_sage_window(layer, k_new, v_new, slots, fresh)
        return
    if layer.key_scale is not None:
        k_new = cast_fp8(k_new, layer.key_scale)
        torch.maximum(layer.value_amax, v_new.abs().amax().float().reshape(1), out=layer.value_amax)
    torch.ops.telefuser.kv_window_write(k_new, v_new, layer.k, layer.v, slots)


@dataclass
class WindowBuffers:
    """A window's device memory: every layer's window K/V, the prompt's K/V per layer and, for FP8 keys, the scales
    and running max |V|. A window allocates its own, or adopts a set that outlives it (graphs.py), whose addresses
    a captured CUDA graph keeps."""

    self_kv: list[LayerKV]
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]]
    key_scales: list[torch.Tensor] | None = None
    key_descales: list[torch.Tensor] | None = None
    value_amax: list[torch.Tensor] | None = None
    sage_stats: list[tuple[torch.Tensor, ...]] | None = None  # LayerState's sage_sm90 fields, in order
    window_shape: tuple[int, int, int, int] | None = None  # [B, capacity, H_local, D] and the model's dtype, as asked
    dtype: torch.dtype | None = None
    _layers: list[LayerState] | None = field(default=None, repr=False)

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        shape: tuple[int, int, int, int],
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        key_scales: list[torch.Tensor] | None,
        *,
        device: torch.device,
        dtype: torch.dtype,
        sage_window: bool = False,
    ) -> WindowBuffers:
        """Zeroed window buffers of `shape` ``[B, capacity, H_local, D]`` for `num_layers` layers, around the given
        prompt K/V (kept as they are; empty for a window without text) and key scales; with `sage_window`, the
        sage_sm90 layout (the module docstring)."""
        if sage_window:
            if key_scales is not None:
                raise WindowError("a window is either FP8-keyed (cudnn_fp8) or quantized for sage_sm90, not both")
            buffers = cls._allocate_sage(num_layers, shape, cross_kv, device, dtype)
        else:
            buffers = cls._allocate_plain(num_layers, shape, cross_kv, key_scales, device, dtype)
        buffers.window_shape, buffers.dtype = tuple(shape), dtype
        return buffers

    @classmethod
    def _allocate_plain(
        cls, num_layers: int, shape, cross_kv, key_scales, device: torch.device, dtype
    ) -> WindowBuffers:
        key_dtype = FP8 if key_scales is not None else dtype
        self_kv = [
            LayerKV(torch.zeros(shape, device=device, dtype=key_dtype), torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(num_layers)
        ]
        buffers = cls(self_kv, cross_kv)
        if key_scales is not None:
            buffers.key_scales = [s.to(device, torch.float32).reshape(1) for s in key_scales]
            buffers.key_descales = [s.reciprocal() for s in buffers.key_scales]
            buffers.value_amax = [torch.zeros(1, device=device) for _ in key_scales]
        return buffers

    @classmethod
    def _allocate_sage(cls, num_layers: int, shape, cross_kv, device: torch.device, dtype) -> WindowBuffers:
        b, capacity, h, d = shape
        padded = -(-capacity // K_BLOCK) * K_BLOCK  # the kernel reads V in whole 128-key blocks
        rows = padded + K_BLOCK  # and a spare block, where a write's padding entries go (attention_sage.touched_blocks)
        groups = rows // K_BLOCK * (4 if default_granularity() == "per_thread" else 1)
        self_kv = [
            LayerKV(
                torch.zeros((b, rows, h, d), device=device, dtype=torch.int8),
                torch.zeros((b, h, d, padded), device=device, dtype=FP8),
            )
            for _ in range(num_layers)
        ]
        buffers = cls(self_kv, cross_kv)
        buffers.sage_stats = [
            (
                torch.zeros((b, h, d), device=device),
                torch.ones((b, h, d), device=device),
                torch.ones((b, h, groups), device=device),
                torch.zeros((b, rows, h, d), device=device, dtype=dtype),
            )
            for _ in range(num_layers)
        ]
        return buffers

    @property
    def sage_window(self) -> bool:
        return self.sage_stats is not None

    def layer_states(self) -> list[LayerState]:
        """Every layer's tensors as a block region takes them (made once)."""
        if self._layers is None:
            fp8 = self.key_scales is not None
            self._layers = [
                LayerState(
                    kv.k,
                    kv.v,
                    *(self.cross_kv[i] if self.cross_kv else (None, None)),
                    self.key_scales[i] if fp8 else None,
                    self.key_descales[i] if fp8 else None,
                    self.value_amax[i] if fp8 else None,
                    *(self.sage_stats[i] if self.sage_window else ()),
                )
                for i, kv in enumerate(self.self_kv)
            ]
        return self._layers

    def load(
        self,
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        key_scales: list[torch.Tensor] | None,
        sage_window: bool = False,
    ) -> None:
        """Start a new window in these buffers: its prompt K/V and key scales copied in place, the windows, the
        running max |V| and a sage window's numbers reset, so it begins exactly as a freshly allocated one."""
        if (
            (key_scales is None) != (self.key_scales is None)
            or sage_window != self.sage_window
            or len(cross_kv) != len(self.cross_kv)
        ):
            raise WindowError(
                "pooled window buffers do not fit this window (FP8 keys, sage_sm90 window or layer count differ)"
            )
        for (k, v), (ck, cv) in zip(cross_kv, self.cross_kv):
            ck.copy_(k)
            cv.copy_(v)
        for kv in self.self_kv:
            kv.k.zero_()
            kv.v.zero_()
        if key_scales is not None:
            for scale, own, descale, amax in zip(key_scales, self.key_scales, self.key_descales, self.value_amax):
                own.copy_(scale.reshape(1))
                torch.reciprocal(own, out=descale)
                amax.zero_()
        for mean, v_scale, k_scales, key_rows in self.sage_stats or ():
            mean.zero_()
            v_scale.fill_(1.0)
            k_scales.fill_(1.0)
            key_rows.zero_()


class KVWindow:
    """One generation stream's cache: rolling self-attention KV per layer, text K/V per layer, and the frame cursor.

    Layer buffers ``[B, local_attn_size * tokens_per_frame, H_local, D]`` hold every row of this rank's heads: the sink
    frames in time order, then a ring of the newest rows whose oldest row is at ring slot `ring_head`, the same for
    every layer. Self-attention has no mask and K is stored after RoPE, so the order of the (K, V) row pairs does not
    change the result (only the summation order). The chunk's K/V are copied in, never referenced (Ulysses scatter
    outputs are reused buffers). Create it with `LingBotWorldV2DiT.new_window`; `close()` drops every buffer.

    With `key_scales` (one fp32 ``[1]`` per layer, for FP8 attention) the K buffers hold e4m3 ``K * scale``: each
    chunk's keys are cast once, when they are written, with a scale from a bound that no key can exceed (see
    `attention.key_scale`), and every later read uses them as they are. V stays in `dtype`; each layer keeps a running
    max |V| over every row it was given (`fp8_scales`), so the attention casts V with no pass over the window to find
    its range.

    With `sage_window` (a window for ``sage_sm90`` attention) the buffers are INT8 keys and transposed e4m3 values
    quantized when written, with the window's numbers (the module docstring); a call quantizes only its queries."""

    def __init__(
        self,
        *,
        batch: int,
        num_layers: int,
        tokens_per_frame: int,
        local_attn_size: int,
        sink_size: int,
        local_heads: int,
        head_dim: int,
        ulysses_degree: int,
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        device: torch.device,
        dtype: torch.dtype,
        key_scales: list[torch.Tensor] | None = None,
        sage_window: bool = False,
        buffers: WindowBuffers | None = None,
        pool_entry: object | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        if local_attn_size < 1:
            raise WindowError(
                f"a streaming session needs a bounded window (local_attn_size >= 1), got {local_attn_size}; "
                "the v2 pipeline uses local_attn_size=18, sink_size=6"
            )
        if tokens_per_frame < 1:
            raise WindowError(f"tokens_per_frame must be positive, got {tokens_per_frame}")
        self.batch = batch
        self.tokens_per_frame = tokens_per_frame
        self.local_attn_size = local_attn_size
        self.sink_size = sink_size
        self.local_heads = local_heads
        self.ulysses_degree = ulysses_degree
        self.device, self.dtype = device, dtype
        self.capacity = local_attn_size * tokens_per_frame
        self.sink_rows = sink_size * tokens_per_frame
        if key_scales is not None and len(key_scales) != num_layers:
            raise WindowError(f"{len(key_scales)} key scales for {num_layers} layers")
        shape = (batch, self.capacity, local_heads, head_dim)
        if buffers is None:
            buffers = WindowBuffers.allocate(
                num_layers, shape, cross_kv, key_scales, device=device, dtype=dtype, sage_window=sage_window
            )
        else:
            if buffers.window_shape != shape or buffers.dtype != dtype:
                raise WindowError(
                    f"pooled window buffers hold {buffers.window_shape} {buffers.dtype}, not {shape} {dtype}"
                )
            buffers.load(cross_kv, key_scales, sage_window)
        self.self_kv: list[LayerKV] | None = buffers.self_kv
        self.cross_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = buffers.cross_kv
        self.key_scales, self.key_descales = buffers.key_scales, buffers.key_descales
        self.value_amax = buffers.value_amax
        self.pool_entry = pool_entry  # where pooled buffers came from (graphs.py), or None
        self._buffers: WindowBuffers | None = buffers
        self._on_close = on_close
        self._slots: tuple[tuple, torch.Tensor] | None = None
        self.committed = 0  # rows in the window
        self.ring_head = 0  # ring slot of the oldest non-sink row (buffer row sink_rows + ring_head)
        # Oldest non-sink rows that read-only steps of the chunk in progress have overwritten with its own K/V (its
        # evicted rows); until its commit, only a chunk that evicts at least as many rows can be served.
        self.overwritten = 0
        self.frame_offset = 0  # latent frames committed so far = the next chunk's first frame position

    # -- state --------------------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.self_kv is None

    @property
    def sage_window(self) -> bool:
        """The window is kept quantized for ``sage_sm90`` attention (INT8 keys, transposed e4m3 values)."""
        return self._buffers is not None and self._buffers.sage_window

    @property
    def fp8_keys(self) -> bool:
        """K is kept in e4m3 (a window made for ``cudnn_fp8`` attention)."""
        return self.key_scales is not None

    def fp8_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K's descale, the running max |V|) of `layer`, fp32 ``[1]`` on the device: what FP8 attention needs."""
        if not self.fp8_keys:
            raise WindowError("this window keeps its keys in the model's dtype, not in FP8")
        return self.key_descales[layer], self.value_amax[layer]

    @property
    def committed_frames(self) -> int:
        return self.frame_offset

    @property
    def max_chunk_frames(self) -> int:
        """A chunk must fit beside the sink: at most local_attn_size - sink_size latent frames."""
        return self.local_attn_size - self.sink_size

    def close(self) -> None:
        """Drop every buffer (local; safe to call twice); pooled buffers go back to their pool."""
        if self.closed:
            return
        self.self_kv, self.cross_kv = None, None
        self.key_scales = self.key_descales = self.value_amax = None
        self._buffers = None
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def __enter__(self) -> "KVWindow":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_open(self) -> None:
        if self.closed:
            raise WindowError("this LingBot KV window is closed")

    # -- the window ---------------------------------------------------------------------------------------------
    def plan(self, frames: int) -> WindowSlots:
        self.check_open()
        if not 1 <= frames <= self.max_chunk_frames:
            raise WindowError(
                f"a chunk of {frames} latent frames does not fit the window: 1..{self.max_chunk_frames} frames "
                f"(local_attn_size {self.local_attn_size} - sink_size {self.sink_size})"
            )
        plan = WindowSlots(
            self.capacity, self.sink_rows, self.committed, frames * self.tokens_per_frame, self.ring_head
        )
        if plan.evicted < self.overwritten:
            # The rows this chunk would keep were overwritten by a bigger uncommitted chunk's read-only steps (as in
            # official inference, a step writes into the chunk's slots); only a stash of them could serve it.
            raise WindowError(
                f"a chunk of {frames} latent frames keeps window rows that an uncommitted chunk's read-only steps "
                f"already replaced ({self.overwritten // self.tokens_per_frame} frames); commit a chunk of at least "
                "that chunk's frames first, or start a new window"
            )
        return plan

    def window(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, plan: WindowSlots, *, commit: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, plan.total, H_local, D]`` for this chunk at `layer`: the chunk's rows are copied
        into the slots of `plan.slots`, the only copy, and the result is the buffer's prefix (views into the layer's
        buffers, in ring order, not time order). A read-only step overwrites the rows the chunk evicts and leaves
        every row it keeps bit-identical; `commit` overwrites the same slots with the clean K/V, which then belong to
        the window (`advance` moves the ring). A sage_sm90 window returns its K prefix and its whole V buffer (kernel
        layout; attend through `LayerState` and the plan's total)."""
        self.check_open()
        cache = self.self_kv[layer]
        if k_new.shape[1] != plan.new_rows:
            raise WindowError(
                f"layer {layer}: the chunk has {k_new.shape[1]} key rows, the plan expects {plan.new_rows}"
            )
        write_window(self.layer_state(layer), k_new, v_new, self._slot_rows(plan, k_new.device), plan.kept == 0)
        self.note_written(plan, commit=commit)
        return cache.k[:, : plan.total], (cache.v if self.sage_window else cache.v[:, : plan.total])

    def _slot_rows(self, plan: WindowSlots, device: torch.device) -> torch.Tensor:
        # every layer of a forward writes the same slots: made once per plan
        if self._slots is None or self._slots[0] != (plan, device):
            self._slots = ((plan, device), plan.slot_rows(device))
        return self._slots[1]

    def layer_state(self, layer: int) -> LayerState:
        """`layer`'s tensors for a block region."""
        return self.layer_states()[layer]

    def layer_states(self) -> list[LayerState]:
        """Every layer's tensors for the block regions (the buffers', so a pooled set gives the same to every window
        that adopts it)."""
        self.check_open()
        return self._buffers.layer_states()

    def note_written(self, plan: WindowSlots, *, commit: bool) -> None:
        """A read-only step wrote the chunk's rows over the rows it evicts: until the commit, only a chunk that evicts
        at least as many can be served (`plan`)."""
        if not commit:
            self.overwritten = max(self.overwritten, plan.evicted)

    def advance(self, plan: WindowSlots, frames: int) -> None:
        """After a committed forward: the window holds plan.total rows, the ring's oldest row moves past the evicted
        ones, and the frame cursor moves on."""
        self.committed = plan.total
        if plan.evicted:
            self.ring_head = (plan.ring_head + plan.evicted) % plan.ring_rows
        self.overwritten = 0
        self.frame_offset += frames

    def time_order(self) -> torch.Tensor:
        """Buffer rows of the committed window in time order (sink, then oldest to newest): for tests and tools
        that want the time-ordered window, ``k[:, window.time_order()]`` (a gather copy; the forward never needs
        it)."""
        sink = min(self.sink_rows, self.committed)
        ring = torch.arange(self.committed - sink)
        if self.committed == self.capacity and ring.numel():
            ring = (ring + self.ring_head) % ring.numel()
        return torch.cat([torch.arange(sink), sink + ring])

    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_open()
        return self.cross_kv[layer]
