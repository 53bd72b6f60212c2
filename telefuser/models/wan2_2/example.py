"""Wan 2.2's DiT sizes by name, one forward on example inputs and its FLOP count: what its `ModelSpec`s point at
(`config_of`, `example_forward`, `forward_flops`).

The example is one denoising step of the pipeline: a CFG batch of two (cond, uncond) at their own timesteps against
the prompt K/V computed once (`text_kv`, outside the step). The default latent grid, 2 frames of 3 x 3 tokens (18
rows), splits unevenly over 4 Ulysses ranks, so padding rows are exercised.
"""

from __future__ import annotations

from ..spec import Example
from ..wan.example import dit_flops, random_inputs, token_rows
from .config import Wan22Config, release


def t2v_a14b_config(size: str) -> Wan22Config:
    return release("t2v-a14b", size).dit


def ti2v_5b_config(size: str) -> Wan22Config:
    return release("ti2v-5b", size).dit


def example(model, *, seed: int = 0, batch: int = 2, frames: int = 2, height: int = 6, width: int = 6, text_rows=7):
    """`model(latents, t, text_kv)` on seeded inputs; sizes in latent units (`text_rows` of encoder states, zero-padded
    to the model's text_len)."""
    shape = {"batch": batch, "frames": frames, "height": height, "width": width, "text_rows": text_rows}
    device = model.patch_embedding.weight.device
    latents, t, text = random_inputs(model.config, seed=seed, device=device, **shape)
    text_kv = model.text_kv(text)
    return Example(run=lambda: (model(latents, t, text_kv),), shape=shape)


def flops(config: Wan22Config, *, batch: int, frames: int, height: int, width: int, text_rows: int = 0) -> int:
    """One step's forward (the prompt is padded to text_len, so `text_rows` does not change it)."""
    rows = token_rows(config, frames, height, width)
    return dit_flops(config, batch=batch, rows=rows, key_rows=rows)
