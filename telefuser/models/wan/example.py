"""Seeded example inputs of a Wan-family DiT and the FLOP count of its forward: what the Wan models' specs build
their `example` and `flops` on (`ModelSpec.example_forward`, `ModelSpec.forward_flops`).

Sizes are in latent units (frames, height, width before the patch); a forward runs over
``frames/pt * height/ph * width/pw`` token rows. FLOPs count 2 per multiply-add of every GEMM (linears, the patch
embedding) and of both attention products, as torch's FlopCounterMode does; norms, RoPE and elementwise work are not
counted.
"""

from __future__ import annotations

import torch

from .config import MODULATION_PARAMS, WanConfig


def token_rows(config: WanConfig, frames: int, height: int, width: int) -> int:
    pt, ph, pw = config.patch_size
    if frames % pt or height % ph or width % pw:
        raise ValueError(f"latent grid {(frames, height, width)} does not split into {config.patch_size} patches")
    return (frames // pt) * (height // ph) * (width // pw)


def random_inputs(
    config: WanConfig, *, seed: int, batch: int, frames: int, height: int, width: int, text_rows: int, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(latents ``[B, in_dim, F, H, W]`` fp32, timesteps ``[B]`` in [0, 1000), encoder states
    ``[B, text_rows, text_dim]`` fp32), drawn on the CPU (the same on every rank and device) and moved to `device`."""
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, config.in_dim, frames, height, width, generator=g)
    t = torch.rand(batch, generator=g) * 1000.0
    text = torch.randn(batch, text_rows, config.text_dim, generator=g)
    return latents.to(device), t.to(device), text.to(device)


def dit_flops(config: WanConfig, *, batch: int, rows: int, key_rows: int) -> int:
    """One forward over `rows` token rows whose self-attention reads `key_rows` keys (the rows themselves for a whole
    sequence): patch embedding, time embedding and its projection, every block (self-attention q/k/v/o, cross-
    attention q/o over the prompt's text_len precomputed K/V, FFN, both attention products) and the head."""
    d, patch = config.dim, config.patch_volume
    embed = 2 * batch * rows * config.in_dim * patch * d
    time = 2 * batch * (config.freq_dim * d + d * d + d * MODULATION_PARAMS * d)
    gemms = 2 * batch * rows * (6 * d * d + 2 * d * config.ffn_dim)
    attention = 4 * batch * rows * d * (key_rows + config.text_len)  # Q.K^T and P.V over all heads: H * D = dim
    head = 2 * batch * rows * d * config.out_dim * patch
    return embed + time + config.num_layers * (gemms + attention) + head
