"""Token layout and the timestep sinusoid: pure functions shared by the model, its tests and the pipeline.

Tokens are raster (f, h, w); patch features are ordered (c, pt, ph, pw), as the Conv3d weight flattens, and output
patch values (pt, ph, pw, c), as Wan's unpatchify reads them.
"""

from __future__ import annotations

import torch


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
