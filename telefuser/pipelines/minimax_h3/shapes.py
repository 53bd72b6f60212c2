"""Request (duration, resolution, aspect ratio) -> frame count, canvas and latent shapes for MiniMax H3.

24 fps video snapped up to ``17n + 5`` frames (``5n + 2`` latent frames), a canvas of 32-pixel multiples, 40 Hz stereo
audio latents over the aligned duration; the rules and their sources are in this folder's README.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from ...sizes import parse_size

FPS = 24
AUDIO_SAMPLE_RATE = 32_000
AUDIO_LATENT_RATE = 40  # latent frames per second; 32000 / 40 = 800 samples per latent frame
AUDIO_HOP = AUDIO_SAMPLE_RATE // AUDIO_LATENT_RATE
AUDIO_CHANNELS = 2
VAE_SPATIAL = 16
VIDEO_LATENT_CHANNELS = 24
AUDIO_LATENT_CHANNELS = 32
OFFICIAL_SHORT_EDGE = 768
# The official area cap is 768 x 1344 = short_edge^2 * 1.75; other short edges (tiny CPU runs) scale it the same way.
MAX_AREA_PER_SHORT_EDGE_SQUARED = 1344 / 768
ASPECT_RATIOS = {
    "21:9": 21 / 9,
    "16:9": 16 / 9,
    "4:3": 4 / 3,
    "1:1": 1.0,
    "3:4": 3 / 4,
    "9:16": 9 / 16,
}


MIN_FRAMES = 22  # 17n + 5 with n = 1: 7 latent frames, the fewest the video VAE decodes


def align_frame_count(frames: int) -> int:
    """Snap up to the next ``17n + 5`` frame count (at least `MIN_FRAMES`)."""
    if frames <= MIN_FRAMES:
        return MIN_FRAMES
    return frames + (5 - frames) % 17


def video_latent_t(frame_count: int) -> int:
    """Latent frames for an aligned frame count: ``17n + 5 -> 5n + 2``."""
    if frame_count < 5 or (frame_count - 5) % 17:
        raise ValueError(f"frame count must be 17n+5, got {frame_count}")
    return (frame_count - 5) // 17 * 5 + 2


def frame_count_from_latent_t(latent_t: int) -> int:
    """Inverse of `video_latent_t`: ``5n + 2 -> 17n + 5``."""
    if latent_t < 2 or (latent_t - 2) % 5:
        raise ValueError(f"video latent length must be 5n+2, got {latent_t}")
    return (latent_t - 2) // 5 * 17 + 5


def audio_latent_t(duration_s: float) -> int:
    return int(round(duration_s * AUDIO_LATENT_RATE))


def canvas_for(short_edge: int, aspect_ratio: str, multiple: int) -> tuple[int, int]:
    """(height, width) for a short edge and a named aspect ratio, following the official area/rounding policy."""
    if aspect_ratio not in ASPECT_RATIOS:
        raise ValueError(f"unknown aspect ratio {aspect_ratio!r}; choose one of {', '.join(ASPECT_RATIOS)}")
    ratio = ASPECT_RATIOS[aspect_ratio]
    width, height = (short_edge * ratio, float(short_edge)) if ratio >= 1 else (float(short_edge), short_edge / ratio)
    max_area = short_edge * short_edge * MAX_AREA_PER_SHORT_EDGE_SQUARED
    if width * height > max_area:
        scale = math.sqrt(max_area / (width * height))
        width, height = width * scale, height * scale
    return _round_to(height, multiple), _round_to(width, multiple)


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, int(round(value / multiple)) * multiple)


@dataclass(frozen=True)
class MiniMaxH3Shape:
    """Everything the loop and the decoders need to know about one request's size."""

    height: int
    width: int
    frame_count: int
    duration_s: float  # aligned: frame_count / FPS
    video_latent_t: int
    latent_h: int
    latent_w: int
    audio_latent_t: int  # per channel; the DiT sees AUDIO_CHANNELS * this many tokens

    @property
    def video_latent_shape(self) -> tuple[int, int, int, int, int]:
        return (1, VIDEO_LATENT_CHANNELS, self.video_latent_t, self.latent_h, self.latent_w)

    @property
    def audio_tokens(self) -> int:
        return AUDIO_CHANNELS * self.audio_latent_t

    @property
    def audio_latent_shape(self) -> tuple[int, int, int]:
        return (1, AUDIO_LATENT_CHANNELS, self.audio_tokens)

    @property
    def audio_samples(self) -> int:
        return self.audio_latent_t * AUDIO_HOP

    def as_dict(self) -> dict:
        return {**asdict(self), "audio_tokens": self.audio_tokens, "audio_samples": self.audio_samples}


def plan_shape(
    *,
    duration_s: float,
    resolution: int | str | tuple[int, int] = OFFICIAL_SHORT_EDGE,
    aspect_ratio: str = "16:9",
    patch_size: tuple[int, int, int] = (1, 2, 2),
) -> MiniMaxH3Shape:
    """Validate a request's size and derive its shapes.

    ``resolution`` is either a short edge in pixels (the canvas follows `aspect_ratio`) or an explicit
    ``"WIDTHxHEIGHT"`` string / ``(height, width)`` tuple (then `aspect_ratio` is not used).
    """
    if not isinstance(duration_s, (int, float)) or isinstance(duration_s, bool) or not math.isfinite(duration_s):
        raise ValueError(f"duration must be a finite number of seconds, got {duration_s!r}")
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    if aspect_ratio not in ASPECT_RATIOS:
        # T2VA has no source image to take "auto" from, so only the named ratios are valid.
        raise ValueError(f"unknown aspect ratio {aspect_ratio!r}; choose one of {', '.join(ASPECT_RATIOS)}")
    multiple = VAE_SPATIAL * max(int(patch_size[1]), int(patch_size[2]))
    height, width = _resolve_canvas(resolution, aspect_ratio, multiple)
    if height % multiple or width % multiple:
        raise ValueError(
            f"resolution {width}x{height} must be divisible by {multiple} (VAE 16x times DiT patch {patch_size[1:]})"
        )
    frame_count = align_frame_count(int(round(duration_s * FPS)))
    aligned_duration = frame_count / FPS
    return MiniMaxH3Shape(
        height=height,
        width=width,
        frame_count=frame_count,
        duration_s=aligned_duration,
        video_latent_t=video_latent_t(frame_count),
        latent_h=height // VAE_SPATIAL,
        latent_w=width // VAE_SPATIAL,
        audio_latent_t=max(1, audio_latent_t(aligned_duration)),
    )


def _resolve_canvas(resolution: int | str | tuple[int, int], aspect_ratio: str, multiple: int) -> tuple[int, int]:
    if isinstance(resolution, tuple):
        height, width = (int(v) for v in resolution)
    elif isinstance(resolution, str) and "x" in resolution.lower():
        try:
            width, height = parse_size(resolution)
        except ValueError as error:
            raise ValueError(f"resolution must be a short edge or WIDTHxHEIGHT, got {resolution!r}") from error
    else:
        try:
            short_edge = int(resolution)
        except (TypeError, ValueError) as error:
            raise ValueError(f"resolution must be a short edge or WIDTHxHEIGHT, got {resolution!r}") from error
        if short_edge <= 0 or short_edge % multiple:
            raise ValueError(f"short edge {short_edge} must be a positive multiple of {multiple}")
        return canvas_for(short_edge, aspect_ratio, multiple)
    if height <= 0 or width <= 0:
        raise ValueError(f"resolution must be positive, got {width}x{height}")
    return height, width
