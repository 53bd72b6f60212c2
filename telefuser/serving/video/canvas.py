"""Sizes the model cannot make directly: generate on its grid, then resize and crop to exactly what was asked.

A model's canvas sides are multiples of its grid (MiniMax H3: 32; Wan 2.2: 16 or 32), and the OpenAI SDK's typed sizes include 1280x720 and 720x1280. A size
off the grid is generated at the nearest-aspect grid canvas around it, scaled to cover with Lanczos and
centre-cropped (1280x720 -> 1312x736); the choice rule is in PROTOCOL.md.
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
    """uint8 [F, h, w, 3] -> [F, height, width, 3] (PROTOCOL.md's resize and crop); a copy-free pass-through
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
    output: Path,
    frames: np.ndarray,
    fps: int,
    audio: np.ndarray | None,
    sample_rate: int | None,
    size: tuple[int, int] | None,
) -> float:
    """Resize to `size` (width, height) when given, mux the MP4 (no audio stream when `audio` is None: a model that
    makes none); returns the seconds it took."""
    import time

    from telefuser.media import write_mp4

    started = time.perf_counter()
    if size is not None:
        frames = fit_frames(frames, *size)
    if audio is None:
        write_mp4(output, frames, fps)
    else:
        write_mp4(output, frames, fps, audio, sample_rate)
    return time.perf_counter() - started
