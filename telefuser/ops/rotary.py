"""Rotary position embeddings (NeoX style: the rotated half is the second half of the rotary dims)."""

from __future__ import annotations

import torch


def rope_frequencies(
    positions: torch.Tensor, rotary_dim: int, theta: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [S, rotary_dim] for integer positions [S]."""
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    inv_freq = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first `cos.shape[-1]` channels of x [B, S, H, D] by per-row angles; the rest pass through."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated_half = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    cos = cos[None, :, None, :].to(x.dtype)
    sin = sin[None, :, None, :].to(x.dtype)
    out = x_rot * cos + rotated_half * sin
    return torch.cat([out, x_pass], dim=-1) if x_pass.shape[-1] else out
