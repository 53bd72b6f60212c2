"""`AdaLNTables`: a request's AdaLN modulation tables, computed once before its first DiT call.

Every MiniMax H3 call projects its timestep embedding through each block's AdaLN linear; the result depends only
on the call's timesteps, which a request knows before it starts. `MiniMaxH3DiT.precompute_adaln` fills these tables
with the very tensors `forward` would compute (the same modules, shapes and dtype: bit-identical), and `forward`
then looks them up instead of reading the projection weights (24 GiB per rank at the official size). Sizes and the
offload option: this folder's README.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import MiniMaxH3Config

TimestepKey = tuple[float, ...]
CallTables = tuple[tuple[tuple[torch.Tensor, ...], ...], tuple[torch.Tensor, torch.Tensor]]


def timestep_key(t_video: torch.Tensor, t_audio: torch.Tensor) -> TimestepKey:
    """The exact float32 values `forward` feeds the time embedder (``cat([t_video, t_audio]).float()``)."""
    return tuple(torch.cat([t_video, t_audio]).float().tolist())


@dataclass
class AdaLNTables:
    """The AdaLN tables of a request's DiT calls, made by `MiniMaxH3DiT.precompute_adaln`.

    For each call (keyed by its timesteps' float32 values): every block's six ``adaln_proj(cond)`` outputs and the
    final layer's two, the very tensors `forward` would compute for it. Under TP they are the all-gathered (full)
    tables, like the per-call ones. `clear()` frees them; a table is looked up, never recomputed."""

    batch: int
    device: torch.device
    calls: dict[TimestepKey, CallTables] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.calls)

    def lookup(self, t_video: torch.Tensor, t_audio: torch.Tensor, device: torch.device) -> CallTables:
        batch = t_video.shape[0]
        if batch != self.batch or torch.device(device) != self.device:
            raise ValueError(
                f"AdaLN tables were computed for batch {self.batch} on {self.device}; this call has batch {batch} "
                f"on {device} (t_video={t_video.tolist()}, t_audio={t_audio.tolist()})"
            )
        key = timestep_key(t_video, t_audio)
        tables = self.calls.get(key)
        if tables is None:
            known = ", ".join(f"{list(k[:batch])}/{list(k[batch:])}" for k in list(self.calls)[:8])
            more = " ..." if len(self.calls) > 8 else ""
            raise ValueError(
                f"no AdaLN table for timesteps t_video={list(key[:batch])}, t_audio={list(key[batch:])}: the tables "
                f"hold {len(self.calls)} calls (t_video/t_audio: {known}{more}); precompute_adaln these timesteps"
            )
        return tables

    @property
    def nbytes(self) -> int:
        """Bytes the tables hold (each projection's output once; the tables are views of it)."""
        storages = {}
        for blocks, final in self.calls.values():
            for t in (*(t for block in blocks for t in block), *final):
                storage = t.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def clear(self) -> None:
        self.calls.clear()


def adaln_table_bytes(config: MiniMaxH3Config, calls: int, *, batch: int = 1, dtype_bytes: int = 2) -> int:
    """What `AdaLNTables` holds for `calls` DiT calls: per call and conditioning row (2 x batch: video and audio
    timesteps), every block's adaln_out_features plus the final layer's, in the projections' dtype; the same on
    every TP rank (the tables are gathered)."""
    per_row = config.num_layers * config.adaln_out_features + config.final_adaln_out_features
    return calls * 2 * batch * per_row * dtype_bytes
