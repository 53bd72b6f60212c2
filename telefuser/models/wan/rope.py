"""Wan's 3-axis rotary embedding (adjacent pairs, split 22/21/21 over frame, height, width for D = 128).

Keys are cached after rotation, so a chunk rotates its frame axis from its first frame's offset; positions are
computed directly, with no 1024-frame table limit.
"""

from __future__ import annotations

import torch

from ...ops.fusion import cuda_fused


def rope_axis_pairs(head_dim: int) -> tuple[int, int, int]:
    """Rotation pairs per axis (frame, height, width)."""
    c = head_dim // 2
    return c - 2 * (c // 3), c // 3, c // 3


def _axis_angles(positions: torch.Tensor, pairs: int, theta: float) -> torch.Tensor:
    inv_freq = theta ** (-torch.arange(0, 2 * pairs, 2, dtype=torch.float64, device=positions.device) / (2 * pairs))
    return positions.to(torch.float64)[:, None] * inv_freq[None, :]


def chunk_rope(
    frame_offset: int,
    frames: int,
    height: int,
    width: int,
    head_dim: int,
    *,
    theta: float = 10000.0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[frames*height*width, head_dim/2]`` (float32) for tokens in raster (f, h, w) order."""
    f_pairs, h_pairs, w_pairs = rope_axis_pairs(head_dim)
    arange = lambda n, start=0: torch.arange(start, start + n, dtype=torch.float64, device=device)
    f = _axis_angles(arange(frames, frame_offset), f_pairs, theta)
    h = _axis_angles(arange(height), h_pairs, theta)
    w = _axis_angles(arange(width), w_pairs, theta)
    angles = torch.cat(
        [
            f[:, None, None, :].expand(frames, height, width, -1),
            h[None, :, None, :].expand(frames, height, width, -1),
            w[None, None, :, :].expand(frames, height, width, -1),
        ],
        dim=-1,
    ).reshape(frames * height * width, -1)
    return angles.cos().float(), angles.sin().float()


@cuda_fused
def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs of x ``[B, S, H, D]`` by per-row angles ``[S, D/2]``; computed in fp32."""
    xf = x.float().unflatten(-1, (-1, 2))
    real, imag = xf[..., 0], xf[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)
