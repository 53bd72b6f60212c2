"""The reference image: decode and validate it, then turn it into the VAE's input at the session's canvas.

Accepted: a path, raw bytes, a PIL image or a uint8 ``[H, W, 3]`` array. The resize follows the reference
(bicubic, in [-1, 1]); which PIL modes pass and how the resize matches are in this folder's README.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

CONVERTIBLE_MODES = ("RGB", "RGBA", "L", "P")


def load_reference_image(image) -> np.ndarray:
    """Any accepted input -> uint8 ``[H, W, 3]`` RGB; ValueError with the reason otherwise."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3 or 0 in image.shape:
            raise ValueError(f"an image array must be uint8 [H, W, 3], got {image.dtype} {image.shape}")
        return np.ascontiguousarray(image)
    if isinstance(image, (str, Path, bytes, bytearray)):
        source = io.BytesIO(bytes(image)) if isinstance(image, (bytes, bytearray)) else str(image)
        name = f"({len(image)} bytes)" if isinstance(image, (bytes, bytearray)) else str(image)
        try:
            with Image.open(source) as opened:
                opened.load()
                image = opened.copy()
        except FileNotFoundError:
            raise ValueError(f"reference image not found: {name}") from None
        except (UnidentifiedImageError, OSError, SyntaxError) as exc:
            raise ValueError(f"cannot decode reference image {name}: {exc}") from None
    if not isinstance(image, Image.Image):
        raise ValueError(f"reference image must be a path, bytes, PIL image or uint8 array, got {type(image).__name__}")
    if image.mode not in CONVERTIBLE_MODES:
        raise ValueError(
            f"reference image mode {image.mode!r} is not supported; use one of {', '.join(CONVERTIBLE_MODES)}"
        )
    if image.width == 0 or image.height == 0:
        raise ValueError("reference image is empty")
    return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()


def image_to_canvas(rgb: np.ndarray, width: int, height: int) -> torch.Tensor:
    """uint8 ``[H0, W0, 3]`` -> float32 ``[3, height, width]`` in about [-1, 1] (bicubic, CPU)."""
    pixels = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float().div(255.0)
    pixels = pixels.sub(0.5).div(0.5)
    return F.interpolate(pixels[None], size=(height, width), mode="bicubic")[0]
