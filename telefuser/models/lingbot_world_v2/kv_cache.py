"""`KVWindow`: one stream's rolling self-attention KV per layer (sink + newest frames), its text K/V and frame cursor.

The buffers are allocated once and never move: a read-only step assembles its keys in one shared scratch pair and
leaves the window bit-identical; a commit rolls in place. The layout and the rules are in this folder's README.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class SessionError(RuntimeError):
    """A session used in a way its cache cannot serve (closed, wrong shape, wrong parallel degree)."""


@dataclass(frozen=True)
class WindowPlan:
    """Where one chunk's keys come from; the same for every layer of one forward."""

    capacity: int
    sink_rows: int
    committed: int  # rows committed before this chunk
    new_rows: int

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
        """Keys the chunk attends to, and the committed rows after a commit."""
        return self.kept + self.new_rows


@dataclass
class LayerKV:
    k: torch.Tensor
    v: torch.Tensor


class KVWindow:
    """One generation stream's cache: rolling self-attention KV per layer, text K/V per layer, and the frame cursor.

    Layer buffers ``[B, local_attn_size * tokens_per_frame, H_local, D]`` hold every row of this rank's heads, in time
    order: the sink frames, then the newest. The chunk's K/V are copied in, never referenced (Ulysses scatter outputs
    are reused buffers). Create it with `LingBotWorldV2DiT.new_session`; `close()` drops every buffer."""

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
        shape = (batch, self.capacity, local_heads, head_dim)
        self.self_kv: list[LayerKV] | None = [
            LayerKV(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(num_layers)
        ]
        self._scratch: LayerKV | None = LayerKV(
            torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype)
        )
        self.cross_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = cross_kv
        self.committed = 0  # rows in the window
        self.frame_offset = 0  # latent frames committed so far = the next chunk's first frame position

    # -- state --------------------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.self_kv is None

    @property
    def committed_frames(self) -> int:
        return self.frame_offset

    @property
    def max_chunk_frames(self) -> int:
        """A chunk must fit beside the sink: at most local_attn_size - sink_size latent frames."""
        return self.local_attn_size - self.sink_size

    def close(self) -> None:
        """Drop every buffer (local; safe to call twice)."""
        self.self_kv, self._scratch, self.cross_kv = None, None, None

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
        return WindowPlan(self.capacity, self.sink_rows, self.committed, frames * self.tokens_per_frame)

    def window(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, plan: WindowPlan, *, commit: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, plan.total, H_local, D]`` for this chunk at `layer` (views into session buffers,
        valid until the next layer's call); with `commit`, the chunk's rows enter the layer's window."""
        self.check_open()
        cache, scratch = self.self_kv[layer], self._scratch
        head, kept, total, n = plan.head_rows, plan.kept, plan.total, plan.new_rows
        if k_new.shape[1] != n:
            raise SessionError(f"layer {layer}: the chunk has {k_new.shape[1]} key rows, the plan expects {n}")
        if commit and plan.evicted == 0:  # append in place and attend to the buffer itself: no scratch copy
            cache.k[:, plan.committed : total].copy_(k_new)
            cache.v[:, plan.committed : total].copy_(v_new)
            return cache.k[:, :total], cache.v[:, :total]
        for buf, src, new in ((scratch.k, cache.k, k_new), (scratch.v, cache.v, v_new)):
            buf[:, :head].copy_(src[:, :head])
            buf[:, head:kept].copy_(src[:, head + plan.evicted : plan.committed])
            buf[:, kept:total].copy_(new)
        if commit:  # roll: kept window rows move down over the evicted ones, then the chunk; the sink stays put
            cache.k[:, head:total].copy_(scratch.k[:, head:total])
            cache.v[:, head:total].copy_(scratch.v[:, head:total])
        return scratch.k[:, :total], scratch.v[:, :total]

    def advance(self, plan: WindowPlan, frames: int) -> None:
        """After a committed forward: the window holds plan.total rows and the frame cursor moves on."""
        self.committed = plan.total
        self.frame_offset += frames

    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_open()
        return self.cross_kv[layer]
