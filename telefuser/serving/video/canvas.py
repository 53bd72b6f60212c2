"""Sizes the model cannot make directly: generate on its grid, then resize and crop to exactly what was asked.

MiniMax H3 makes canvases whose sides are multiples of 32 (VAE 16x, DiT patch 2). The OpenAI SDK's typed sizes
include 1280x720 and 720x1280, and 720 is not such a multiple. For a requested W x H off the grid, the service
generates at the grid canvas nearest the requested aspect among the four around it (each side at the multiple at or
below the requested length, or the one above; ties: one that covers the request, so nothing is upscaled, then the
smaller), scales that to cover W x H with Lanczos and crops the centre (`PIL.ImageOps.fit`). 1280x720 -> 1312x736
(aspect 1.783 for 1.778), scaled by 0.978 and cropped by 4 columns. A size on the grid is generated as it is.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

RESIZE_METHOD = "scale to cover with Lanczos, then centre crop (PIL.ImageOps.fit)"


def generation_canvas(width: int, height: int, multiple: int) -> tuple[int, int]:
    """The (width, height) to generate for a requested output size (itself when it is on the grid)."""
    if width % multiple == 0 and height % multiple == 0:
        return width, height
    target = math.log(width / height)

    def score(canvas: tuple[int, int]) -> tuple[float, bool, int]:
        w, h = canvas
        return round(abs(math.log(w / h) - target), 12), not (w >= width and h >= height), w * h

    return min(((w, h) for w in _neighbours(width, multiple) for h in _neighbours(height, multiple)), key=score)


def _neighbours(value: int, multiple: int) -> set[int]:
    down = max(multiple, value // multiple * multiple)
    return {down, down + multiple}


def fit_frames(frames: np.ndarray, width: int, height: int) -> np.ndarray:
    """uint8 [F, h, w, 3] -> [F, height, width, 3] (the module docstring's resize and crop); a copy-free pass-through
    when the size already matches."""
    if frames.shape[1:3] == (height, width):
        return frames
    from PIL import Image, ImageOps

    out = np.empty((frames.shape[0], height, width, 3), np.uint8)
    for i, frame in enumerate(frames):
        fitted = ImageOps.fit(Image.fromarray(frame), (width, height), Image.Resampling.LANCZOS, centering=(0.5, 0.5))
        out[i] = np.asarray(fitted)
    return out


def write_clip(
    output: Path, frames: np.ndarray, fps: int, audio: np.ndarray, sample_rate: int, size: tuple[int, int] | None
) -> float:
    """Resize to `size` (width, height) when given, mux the MP4; returns the seconds it took."""
    import time

    from telefuser.media import write_mp4

    started = time.perf_counter()
    if size is not None:
        frames = fit_frames(frames, *size)
    write_mp4(output, frames, fps, audio, sample_rate)
    return time.perf_counter() - started
