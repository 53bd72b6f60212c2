"""Timestep embedding and the 3-axis rotary table. Both stay in fp32, as in the released checkpoint."""

from __future__ import annotations

import math

import torch
from torch import nn


class TimestepEmbedder(nn.Module):
    """t in [0, 1] -> sinusoid [cos | sin] (fp32) -> proj_in -> SiLU -> proj_out: [M, time_embed_dim]."""

    def __init__(self, input_dim: int, hidden_size: int, out_dim: int):
        super().__init__()
        self.input_dim = input_dim
        self.proj_in = nn.Linear(input_dim, hidden_size)
        self.proj_out = nn.Linear(hidden_size, out_dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.input_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        sinusoid = torch.cat([args.cos(), args.sin()], dim=-1)
        dtype = self.proj_in.weight.dtype
        return self.proj_out(nn.functional.silu(self.proj_in(sinusoid.to(dtype))))


class Rope3D(nn.Module):
    """(t, h, w) positions -> cos/sin [S, 6n]: per-axis angles pos * inv_freq (n each), concatenated t|h|w, then
    duplicated for the NeoX rotate-half convention. Only these 6n channels of a head rotate; the rest pass through."""

    def __init__(self, inv_freq_len: int, theta: float = 10000.0):
        super().__init__()
        inv_freq = theta ** (-torch.arange(inv_freq_len, dtype=torch.float32) / inv_freq_len)
        self.register_buffer("inv_freq", inv_freq, persistent=True)  # shipped in the checkpoint (fp32)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, :, None] * self.inv_freq.float()[None, None, :]  # [S, 3, n]
        half = angles.flatten(1)  # [S, 3n]: t freqs, then h, then w
        angles = torch.cat([half, half], dim=-1)
        return angles.cos(), angles.sin()
