"""Wan 2.2 TI2V-5B's image condition, as diffusers' ``WanImageToVideoPipeline`` with ``expand_timesteps=True`` runs it.

The image is stretched onto the canvas (PIL LANCZOS, diffusers' ``VideoProcessor.preprocess``), scaled to [-1, 1] and
VAE-encoded as one latent frame (the posterior's mode, normalised): the condition. Each step the model sees the
latents with latent frame 0 replaced by the condition, and that frame's tokens run at timestep 0 while the others run
at t (a timestep per token); the scheduler steps the latents themselves, and the condition replaces frame 0 once more
before the decode. diffusers writes the replacement as ``(1 - mask) * condition + mask * latents`` with a 0/1 mask:
for finite values that is the copy done here, bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

IMAGE_MODES = ("RGB", "RGBA", "L", "P")  # what converts to RGB as diffusers' load_image does


def image_pixels(image, width: int, height: int) -> torch.Tensor:
    """A PIL image -> float32 ``[3, height, width]`` in [-1, 1]: RGB, resized with LANCZOS (untouched at the canvas
    size), ``2 * (v / 255) - 1``; ValueError naming what is wrong with `image`."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise ValueError(f"the image must be a PIL image, got {type(image).__name__}")
    if image.mode not in IMAGE_MODES:
        raise ValueError(f"image mode {image.mode!r} is not supported; use one of {', '.join(IMAGE_MODES)}")
    if image.width == 0 or image.height == 0:
        raise ValueError("the image is empty")
    rgb = image.convert("RGB")
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.LANCZOS)
    unit = np.asarray(rgb, dtype=np.float32) / 255.0  # the same float32 arithmetic as diffusers' pil_to_numpy
    return torch.from_numpy(2.0 * unit - 1.0).permute(2, 0, 1).contiguous()


def with_first_frame(latents: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
    """`latents` ``[B, C, F, h, w]`` with latent frame 0 replaced by `condition` ``[1, C, 1, h, w]``."""
    return torch.cat([condition.expand(latents.shape[0], -1, -1, -1, -1).to(latents.dtype), latents[:, :, 1:]], dim=2)


def first_frame_timesteps(
    t: torch.Tensor, batch: int, latent_grid: tuple[int, int, int], patch_size: tuple[int, int, int]
) -> torch.Tensor:
    """Per-token timesteps ``[batch, N]`` (float32, raster (f, h, w) token order): 0 for the tokens of latent frame 0,
    the scheduler's t for every other (diffusers: ``(mask[0][0][:, ::2, ::2] * t).flatten()``)."""
    frames, height, width = latent_grid
    pt, ph, pw = patch_size
    if pt != 1:
        raise ValueError(f"the first-frame condition needs a temporal patch of 1, got patch_size {patch_size}")
    per_frame = (height // ph) * (width // pw)
    timesteps = t.to(torch.float32).expand(batch, frames * per_frame).clone()
    timesteps[:, :per_frame] = 0.0
    return timesteps
