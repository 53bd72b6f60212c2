"""`KVWindow`: one stream's rolling self-attention KV per layer (sink + newest frames), its text K/V and frame cursor.

The buffers are allocated once and never move. Each holds the sink rows, then a ring of the other rows, so a chunk
(read-only step or commit) copies only its own rows, into the slots of the rows it evicts or after the committed ones,
and attends to a prefix of the buffer: no scratch, no roll. The layout and the rules are in this folder's README.

`WindowSlots` plans where a chunk's rows go (and gives them as device data, `slot_rows`); how the rows are stored,
written and attended is the window's format (window_formats.py: plain, FP8 keys, or SageAttention2's SM90 layout). A
window may adopt `WindowBuffers` that outlive it (graphs.py pools them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...ops.attention_registry import backend_names, get_backend
from .window_formats import PLAIN_WINDOW, WindowBuffers, WindowFormat


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
        """`slots` as device data: the buffer row of each chunk row, int64 ``[new_rows]`` (for a format's `write`)."""
        return torch.cat([torch.arange(row, row + rows, device=device) for row, _, rows in self.slots])


class KVWindow:
    """One generation stream's cache: rolling self-attention KV per layer, text K/V per layer, and the frame cursor.

    Layer buffers ``[B, local_attn_size * tokens_per_frame, H_local, D]`` hold every row of this rank's heads: the sink
    frames in time order, then a ring of the newest rows whose oldest row is at ring slot `ring_head`, the same for
    every layer. Self-attention has no mask and K is stored after RoPE, so the order of the (K, V) row pairs does not
    change the result (only the summation order). The chunk's K/V are copied in, never referenced (Ulysses scatter
    outputs are reused buffers). Create it with `LingBotWorldV2DiT.new_window`; `close()` drops every buffer.

    `window_format` says how the rows are kept (window_formats.py); an FP8-key window takes `key_scales`, one fp32
    ``[1]`` per layer (`window_formats.key_scale`). `layers` are every layer's tensors, as a block region takes them."""

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
        window_format: WindowFormat = PLAIN_WINDOW,
        key_scales: list[torch.Tensor] | None = None,
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
        if window_format.needs_key_scales != (key_scales is not None):
            raise WindowError(f"{window_format} {'needs' if window_format.needs_key_scales else 'takes no'} key scales")
        if key_scales is not None and len(key_scales) != num_layers:
            raise WindowError(f"{len(key_scales)} key scales for {num_layers} layers")
        self.batch = batch
        self.tokens_per_frame = tokens_per_frame
        self.local_attn_size = local_attn_size
        self.sink_size = sink_size
        self.local_heads = local_heads
        self.ulysses_degree = ulysses_degree
        self.device, self.dtype = device, dtype
        self.capacity = local_attn_size * tokens_per_frame
        self.sink_rows = sink_size * tokens_per_frame
        self.format = window_format
        shape = (batch, self.capacity, local_heads, head_dim)
        if buffers is None:
            buffers = window_format.allocate(num_layers, shape, cross_kv, key_scales, device=device, dtype=dtype)
        else:
            asked = (window_format, shape, dtype, num_layers)
            if (buffers.format, buffers.shape, buffers.dtype, len(buffers.layers)) != asked:
                raise WindowError(
                    f"pooled window buffers hold {len(buffers.layers)} layers of {buffers.shape} {buffers.dtype} in "
                    f"the {buffers.format.name!r} format, not {num_layers} of {shape} {dtype} in {window_format.name!r}"
                )
            window_format.load(buffers, cross_kv, key_scales)
        self.pool_entry = pool_entry  # where pooled buffers came from (graphs.py), or None
        self._buffers: WindowBuffers | None = buffers
        self._on_close = on_close
        self.committed = 0  # rows in the window
        self.ring_head = 0  # ring slot of the oldest non-sink row (buffer row sink_rows + ring_head)
        # Oldest non-sink rows that read-only steps of the chunk in progress have overwritten with its own K/V (its
        # evicted rows); until its commit, only a chunk that evicts at least as many rows can be served.
        self.overwritten = 0
        self.frame_offset = 0  # latent frames committed so far = the next chunk's first frame position

    # -- state --------------------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._buffers is None

    @property
    def layers(self) -> list:
        """Every layer's tensors, the format's NamedTuple each (the buffers', so a pooled set gives the same to every
        window that adopts it)."""
        self.check_open()
        return self._buffers.layers

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

    def check_serves(self, attn_impl: str, ulysses_degree: int) -> None:
        """The window is open and serves a model that runs attention `attn_impl` at `ulysses_degree`: the degree it was
        made for, and a backend that reads its format (a plain window every backend, a quantized one its own)."""
        self.check_open()
        if self.ulysses_degree != ulysses_degree:
            raise WindowError(
                f"the window was made for Ulysses degree {self.ulysses_degree}, the model runs {ulysses_degree}; "
                "make a new window after parallelizing the model"
            )
        if not self.format.read_by(attn_impl):
            kept = self.format.name
            readers = [name for name in backend_names() if get_backend(name).window_format == kept]
            raise WindowError(
                f"the KV window is kept in the {kept!r} format, which attention {', '.join(readers)} reads; "
                f"the model now runs {attn_impl!r}: make a new window"
            )

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
