"""LingBot-World v2's DiT sizes by name, one forward on example inputs and its FLOP count: what its `ModelSpec`
points at (`config_of`, `example_forward`, `forward_flops`).

The example is one denoising read of a session's chunk: a KV window holding the prompt's K/V and, with
`history_chunks`, that many committed chunks of the same size before it, then `forward_chunk(..., update_cache=False)`
with raw camera features (the chunk's camera modulation is computed in the forward). By default it is the first
chunk, which attends only to its own rows; a history longer than the window rolls it (the sink frames stay, the
oldest others go). The default chunk, 2 latent frames of 3 x 3 tokens (18 rows), splits unevenly over 4 Ulysses
ranks, so padding rows are exercised.
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


def example(model, *, seed=0, batch=1, frames=2, height=6, width=6, text_rows=5, history_chunks=0) -> Example:
    """`forward_chunk` reading a session's chunk on seeded inputs, after `history_chunks` committed chunks of the
    same size (committed here, at t = 0 as a session commits; `run()` repeats only the read, which keeps the rows it
    reads, so every call computes the same); sizes in latent units."""
    chunk = {"batch": batch, "frames": frames, "height": height, "width": width, "text_rows": text_rows}
    config = model.config
    device = model.patch_embedding.weight.device
    latents, t, text = random_inputs(config, seed=seed, device=device, **chunk)
    rows = token_rows(config, frames, height, width)
    g = torch.Generator().manual_seed(seed + 1)
    camera = torch.randn(batch, rows, config.camera_feature_dim, generator=g).to(device)
    window = model.new_window(batch, text, tokens_per_frame=rows // frames)
    clean = torch.zeros(batch, device=device)
    for _ in range(history_chunks):
        model.commit_chunk(window, torch.randn(latents.shape, generator=g).to(device), clean, camera)

    def run():
        return (model.forward_chunk(window, latents, t, camera, update_cache=False),)

    return Example(run=run, shape={**chunk, "history_chunks": history_chunks}, names=("flow",))


def flops(
    config: LingBotWorldV2Config,
    *,
    batch: int,
    frames: int,
    height: int,
    width: int,
    text_rows=0,
    history_chunks: int = 0,
) -> int:
    """The chunk's read: the Wan forward over its own rows, its self-attention reading the rows the window keeps
    beside them (all committed ones until the window is full, then the window's capacity in all), plus the camera
    embedding (the ray projection and two d x d layers) and each block's four d x d camera layers."""
    rows = token_rows(config, frames, height, width)
    key_rows = min(rows * (history_chunks + 1), config.local_attn_size * (rows // frames))
    d = config.dim
    camera = 2 * batch * rows * (config.camera_feature_dim * d + 2 * d * d + config.num_layers * 4 * d * d)
    return dit_flops(config, batch=batch, rows=rows, key_rows=key_rows) + camera
