"""`KVWindow`: one stream's rolling self-attention KV per layer (sink + newest frames), its text K/V and frame cursor.

The buffers are allocated once and never move. Each holds the sink rows, then a ring of the other rows, so a chunk
(read-only step or commit) copies only its own rows, into the slots of the rows it evicts or after the committed ones,
and attends to a prefix of the buffer: no scratch, no roll. The layout and the rules are in this folder's README.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...ops.attention_fp8 import FP8, cast_fp8


class SessionError(RuntimeError):
    """A session used in a way its cache cannot serve (closed, wrong shape, wrong parallel degree)."""


@dataclass(frozen=True)
class WindowPlan:
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


@dataclass
class LayerKV:
    k: torch.Tensor
    v: torch.Tensor


class KVWindow:
    """One generation stream's cache: rolling self-attention KV per layer, text K/V per layer, and the frame cursor.

    Layer buffers ``[B, local_attn_size * tokens_per_frame, H_local, D]`` hold every row of this rank's heads: the sink
    frames in time order, then a ring of the newest rows whose oldest row is at ring slot `ring_head`, the same for
    every layer. Self-attention has no mask and K is stored after RoPE, so the order of the (K, V) row pairs does not
    change the result (only the summation order). The chunk's K/V are copied in, never referenced (Ulysses scatter
    outputs are reused buffers). Create it with `LingBotWorldV2DiT.new_session`; `close()` drops every buffer.

    With `key_scales` (one fp32 ``[1]`` per layer, for FP8 attention) the K buffers hold e4m3 ``K * scale``: each
    chunk's keys are cast once, when they are written, with a scale from a bound that no key can exceed (see
    `attention.key_scale`), and every later read uses them as they are. V stays in `dtype`; each layer keeps a running
    max |V| over every row it was given (`fp8_scales`), so the attention casts V with no pass over the window to find
    its range."""

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
    ):
        if local_attn_size < 1:
            raise SessionError(
                f"a streaming session needs a bounded window (local_attn_size >= 1), got {local_attn_size}; "
                "the v2 pipeline uses local_attn_size=18, sink_size=6"
            )
        if tokens_per_frame < 1:
            raise SessionError(f"tokens_per_frame must be positive, got {tokens_per_frame}")
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
            raise SessionError(f"{len(key_scales)} key scales for {num_layers} layers")
        self.key_scales = None if key_scales is None else [s.to(device, torch.float32).reshape(1) for s in key_scales]
        self.key_descales = None if key_scales is None else [s.reciprocal() for s in self.key_scales]
        self.value_amax = None if key_scales is None else [torch.zeros(1, device=device) for _ in range(num_layers)]
        shape = (batch, self.capacity, local_heads, head_dim)
        key_dtype = FP8 if key_scales is not None else dtype
        self.self_kv: list[LayerKV] | None = [
            LayerKV(torch.zeros(shape, device=device, dtype=key_dtype), torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(num_layers)
        ]
        self.cross_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = cross_kv
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
    def fp8_keys(self) -> bool:
        """K is kept in e4m3 (a session made for ``cudnn_fp8`` attention)."""
        return self.key_scales is not None

    def fp8_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K's descale, the running max |V|) of `layer`, fp32 ``[1]`` on the device: what FP8 attention needs."""
        if not self.fp8_keys:
            raise SessionError("this session keeps its keys in the model's dtype, not in FP8")
        return self.key_descales[layer], self.value_amax[layer]

    @property
    def committed_frames(self) -> int:
        return self.frame_offset

    @property
    def max_chunk_frames(self) -> int:
        """A chunk must fit beside the sink: at most local_attn_size - sink_size latent frames."""
        return self.local_attn_size - self.sink_size

    def close(self) -> None:
        """Drop every buffer (local; safe to call twice)."""
        self.self_kv, self.cross_kv = None, None
        self.key_scales = self.key_descales = self.value_amax = None

    def __enter__(self) -> "KVWindow":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_open(self) -> None:
        if self.closed:
            raise SessionError("this LingBot session is closed")

    # -- the window ---------------------------------------------------------------------------------------------
    def plan(self, frames: int) -> WindowPlan:
        self.check_open()
        if not 1 <= frames <= self.max_chunk_frames:
            raise SessionError(
                f"a chunk of {frames} latent frames does not fit the window: 1..{self.max_chunk_frames} frames "
                f"(local_attn_size {self.local_attn_size} - sink_size {self.sink_size})"
            )
        plan = WindowPlan(self.capacity, self.sink_rows, self.committed, frames * self.tokens_per_frame, self.ring_head)
        if plan.evicted < self.overwritten:
            # The rows this chunk would keep were overwritten by a bigger uncommitted chunk's read-only steps (as in
            # official inference, a step writes into the chunk's slots); only a stash of them could serve it.
            raise SessionError(
                f"a chunk of {frames} latent frames keeps window rows that an uncommitted chunk's read-only steps "
                f"already replaced ({self.overwritten // self.tokens_per_frame} frames); commit a chunk of at least "
                "that chunk's frames first, or start a new session"
            )
        return plan

    def window(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, plan: WindowPlan, *, commit: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, plan.total, H_local, D]`` for this chunk at `layer`: the chunk's rows are copied
        into the slots of `plan.slots`, the only copy, and the result is the buffer's prefix (views into the layer's
        buffers, in ring order, not time order). A read-only step overwrites the rows the chunk evicts and leaves
        every row it keeps bit-identical; `commit` overwrites the same slots with the clean K/V, which then belong to
        the window (`advance` moves the ring)."""
        self.check_open()
        cache = self.self_kv[layer]
        if k_new.shape[1] != plan.new_rows:
            raise SessionError(
                f"layer {layer}: the chunk has {k_new.shape[1]} key rows, the plan expects {plan.new_rows}"
            )
        if self.fp8_keys:  # K cast once, here; V's range grows with every row it is given (no host sync)
            k_new = cast_fp8(k_new, self.key_scales[layer])
            amax = self.value_amax[layer]
            torch.maximum(amax, v_new.abs().amax().float().reshape(1), out=amax)
        for row, first, rows in plan.slots:
            cache.k[:, row : row + rows].copy_(k_new[:, first : first + rows])
            cache.v[:, row : row + rows].copy_(v_new[:, first : first + rows])
        if not commit:
            self.overwritten = max(self.overwritten, plan.evicted)
        return cache.k[:, : plan.total], cache.v[:, : plan.total]

    def advance(self, plan: WindowPlan, frames: int) -> None:
        """After a committed forward: the window holds plan.total rows, the ring's oldest row moves past the evicted
        ones, and the frame cursor moves on."""
        self.committed = plan.total
        if plan.evicted:
            self.ring_head = (plan.ring_head + plan.evicted) % plan.ring_rows
        self.overwritten = 0
        self.frame_offset += frames

    def time_order(self) -> torch.Tensor:
        """Buffer rows of the committed window in time order (sink, then oldest to newest): for tests and tools
        that want the time-ordered window, ``k[:, session.time_order()]`` (a gather copy; the forward never needs
        it)."""
        sink = min(self.sink_rows, self.committed)
        ring = torch.arange(self.committed - sink)
        if self.committed == self.capacity and ring.numel():
            ring = (ring + self.ring_head) % ring.numel()
        return torch.cat([torch.arange(sink), sink + ring])

    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_open()
        return self.cross_kv[layer]
