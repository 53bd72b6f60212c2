"""LingBot-World v2's DiT sizes by name, one forward on example inputs and its FLOP count: what its `ModelSpec`
points at (`config_of`, `example_forward`, `forward_flops`).

The example is one denoising read of a session's first chunk: a fresh KV window holding the prompt's K/V, then
`forward_chunk(..., update_cache=False)` with raw camera features (the chunk's camera modulation is computed in the
forward). A first chunk attends only to its own rows. The default chunk, 2 latent frames of 3 x 3 tokens (18 rows),
splits unevenly over 4 Ulysses ranks, so padding rows are exercised.
"""

from __future__ import annotations

import torch

from ..spec import Example
from ..wan.example import dit_flops, random_inputs, token_rows
from .config import LingBotWorldV2Config


def dit_config(size: str) -> LingBotWorldV2Config:
    """tiny: CPU-sized, with the tiny session's 10-frame window (2 sink frames), as `--config tiny` runs it; official:
    the released 14B DiT and the v2 window."""
    return LingBotWorldV2Config.tiny_session() if size == "tiny" else LingBotWorldV2Config()


def example(model, *, seed: int = 0, batch: int = 1, frames: int = 2, height: int = 6, width: int = 6, text_rows=5):
    """`forward_chunk` of a session's first chunk on seeded inputs; sizes in latent units."""
    shape = {"batch": batch, "frames": frames, "height": height, "width": width, "text_rows": text_rows}
    config = model.config
    device = model.patch_embedding.weight.device
    latents, t, text = random_inputs(config, seed=seed, device=device, **shape)
    rows = token_rows(config, frames, height, width)
    g = torch.Generator().manual_seed(seed + 1)
    camera = torch.randn(batch, rows, config.camera_feature_dim, generator=g).to(device)
    window = model.new_window(batch, text, tokens_per_frame=rows // frames)

    def run():
        return (model.forward_chunk(window, latents, t, camera, update_cache=False),)

    return Example(run=run, shape=shape)


def flops(config: LingBotWorldV2Config, *, batch: int, frames: int, height: int, width: int, text_rows=0) -> int:
    """The first chunk's read: the Wan forward over its own rows, plus the camera embedding (the ray projection and
    two d x d layers) and each block's four d x d camera layers."""
    rows = token_rows(config, frames, height, width)
    d = config.dim
    camera = 2 * batch * rows * (config.camera_feature_dim * d + 2 * d * d + config.num_layers * 4 * d * d)
    return dit_flops(config, batch=batch, rows=rows, key_rows=rows) + camera
