"""Token layout, the timestep sinusoid, and the released patch, time and text embeddings applied.

Tokens are raster (f, h, w); patch features are ordered (c, pt, ph, pw), as the Conv3d weight flattens, and output
patch values (pt, ph, pw, c), as Wan's unpatchify reads them. A timestep is one per sample (``[B]``) or one per token
(``[B, N]``, diffusers' ``timestep`` of shape (batch, seq_len): Wan 2.2 TI2V-5B's image condition).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .attention import run_linear
from .config import MODULATION_PARAMS


def sinusoidal_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """Wan's timestep sinusoid: ``[cos | sin]`` of ``t * 10000^(-i/half)`` in float64, returned as float32.
    t is the raw scheduler timestep in [0, 1000] (no rescaling)."""
    half = dim // 2
    position = t.to(torch.float64)
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    angles = torch.outer(position, freqs)
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()


def patchify(x: torch.Tensor, patch_size: tuple[int, int, int]) -> torch.Tensor:
    """``[B, C, F, H, W]`` -> ``[B, F'*H'*W', C*pt*ph*pw]``: rows raster (f, h, w), features (c, pt, ph, pw)."""
    b, c, f, h, w = x.shape
    pt, ph, pw = patch_size
    x = x.reshape(b, c, f // pt, pt, h // ph, ph, w // pw, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(b, (f // pt) * (h // ph) * (w // pw), c * pt * ph * pw)


def unpatchify(tokens: torch.Tensor, grid: tuple[int, int, int], patch_size: tuple[int, int, int]) -> torch.Tensor:
    """``[B, N, pt*ph*pw*C]`` with features (pt, ph, pw, c) -> ``[B, C, F, H, W]``."""
    f, h, w = grid
    pt, ph, pw = patch_size
    b = tokens.shape[0]
    x = tokens.reshape(b, f, h, w, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, -1, f * pt, h * ph, w * pw)


# -- the released embedding layers, applied ------------------------------------------------------------------------
def embed_patches(patch_embedding: nn.Conv3d, tokens: torch.Tensor) -> torch.Tensor:
    """Patchified tokens ``[B, N, C*pt*ph*pw]`` through the Conv3d patch embedding (a linear on its flattened
    weight: the rows may be any subset of the grid, this rank's share under Ulysses) -> ``[B, N, dim]`` fp32."""
    weight = patch_embedding.weight
    return F.linear(tokens.to(weight.dtype), weight.flatten(1), patch_embedding.bias).float()


def embed_time(
    time_embedding: nn.Sequential, time_projection: nn.Sequential, freq_dim: int, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Timesteps ``[B]`` -> (t_emb ``[B, dim]``, t_mod ``[B, 6, dim]``), both fp32: the sinusoid through
    ``time_embedding`` (Linear, SiLU, Linear), then ``time_projection`` (SiLU, Linear) into the blocks' six
    modulation vectors."""
    t_emb = run_linear(time_embedding[2], F.silu(run_linear(time_embedding[0], sinusoidal_embedding(freq_dim, t))))
    t_emb = t_emb.float()
    t_mod = run_linear(time_projection[1], F.silu(t_emb)).float()
    return t_emb, t_mod.unflatten(1, (MODULATION_PARAMS, t_emb.shape[1]))


class RowModulation(NamedTuple):
    """A timestep embedding per token row, kept compact: `table` ``[K, ...]`` holds the embedding of each distinct
    timestep (a few: TI2V's are 0 and t), `index` ``[B, S]`` each row's entry in it. The rows may be a rank's share
    (`index` is split over the Ulysses group as the tokens are)."""

    table: torch.Tensor
    index: torch.Tensor


def embed_time_per_row(
    time_embedding: nn.Sequential, time_projection: nn.Sequential, freq_dim: int, t: torch.Tensor
) -> tuple[RowModulation, RowModulation]:
    """Timesteps per token ``[B, N]`` -> (t_emb, t_mod) as `RowModulation`s over the N rows: every distinct timestep
    embedded once (`embed_time`), each row indexing its own. Equal per-row values give equal rows, as embedding
    every token does; ``torch.unique`` makes one device sync."""
    distinct, index = torch.unique(t, return_inverse=True)
    t_emb, t_mod = embed_time(time_embedding, time_projection, freq_dim, distinct)
    return RowModulation(t_emb, index), RowModulation(t_mod, index)


def embed_text(text_embedding: nn.Sequential, text: torch.Tensor) -> torch.Tensor:
    """Encoder states ``[B, L, text_dim]`` through ``text_embedding`` (Linear, GELU-tanh, Linear) -> ``[B, L, dim]``
    in the linears' dtype."""
    return run_linear(text_embedding[2], text_embedding[1](run_linear(text_embedding[0], text)))
