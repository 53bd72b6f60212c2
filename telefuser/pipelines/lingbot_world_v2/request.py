"""A session request -> its plan: canvas, latent grid, chunks and frames per chunk; bad requests are ValueErrors.

Width and height are multiples of 16 and frame counts ``1 + 4k``; a chunk is 4 latent frames (13 frames for chunk 0,
16 after). The frame policies for a count that is not a whole number of chunks (`strict`, `truncate`) are in this
folder's README.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from ...sizes import parse_size

FRAME_POLICIES = ("strict", "truncate")
VAE_STRIDE = (4, 8, 8)  # time, height, width
PATCH_SIZE = (1, 2, 2)
CHUNK_LATENT_FRAMES = 4
DEFAULT_RESOLUTION = (832, 480)
DEFAULT_NUM_FRAMES = 77
DEFAULT_FPS = 16
DEFAULT_SEED = 42
DEFAULT_FRAME_POLICY = "truncate"


@dataclass(frozen=True)
class SessionShape:
    width: int
    height: int
    num_frames: int  # frames delivered (the effective count)
    requested_frames: int
    fps: float
    frame_policy: str
    chunk_latent_frames: int
    latent_height: int
    latent_width: int
    latent_frames: int  # latent frames generated (whole chunks)
    total_chunks: int
    frames_per_chunk: tuple[int, ...]  # frames per chunk: 13 for chunk 0, 16 after (with 4-latent chunks)
    tokens_per_frame: int  # DiT tokens per latent frame

    def as_dict(self) -> dict:
        return asdict(self)


def parse_resolution(resolution) -> tuple[int, int]:
    """``(width, height)`` from a ``(w, h)`` pair or a ``"WxH"`` string."""
    if isinstance(resolution, str):
        width, height = parse_size(resolution, what="resolution")
    else:
        try:
            width, height = resolution
        except (TypeError, ValueError):
            raise ValueError(f"resolution must be (width, height) or 'WxH', got {resolution!r}") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (width, height)):
            raise ValueError(f"resolution must hold integers, got {resolution!r}")
    return width, height


def plan_session(
    *,
    resolution=DEFAULT_RESOLUTION,
    num_frames: int = DEFAULT_NUM_FRAMES,
    fps: float = DEFAULT_FPS,
    frame_policy: str = DEFAULT_FRAME_POLICY,
    chunk_latent_frames: int = CHUNK_LATENT_FRAMES,
) -> SessionShape:
    width, height = parse_resolution(resolution)
    multiple = VAE_STRIDE[1] * PATCH_SIZE[1]
    if width <= 0 or height <= 0 or width % multiple or height % multiple:
        raise ValueError(
            f"resolution {width}x{height}: width and height must be positive multiples of {multiple} "
            f"(VAE stride 8 x DiT patch 2)"
        )
    if not isinstance(num_frames, int) or isinstance(num_frames, bool) or num_frames < 1:
        raise ValueError(f"num_frames must be a positive integer, got {num_frames!r}")
    if (num_frames - 1) % VAE_STRIDE[0]:
        raise ValueError(
            f"num_frames must be 1 + 4k (Wan's VAE: a causal first frame, then 4 frames per latent), got "
            f"{num_frames}; nearest: {num_frames - (num_frames - 1) % 4} or {num_frames + 4 - (num_frames - 1) % 4}"
        )
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps must be a positive number, got {fps!r}")
    if frame_policy not in FRAME_POLICIES:
        raise ValueError(f"frame_policy must be one of {FRAME_POLICIES}, got {frame_policy!r}")
    if not isinstance(chunk_latent_frames, int) or chunk_latent_frames < 1:
        raise ValueError(f"chunk_latent_frames must be a positive integer, got {chunk_latent_frames!r}")

    latent_frames = (num_frames - 1) // VAE_STRIDE[0] + 1
    if frame_policy == "truncate":
        latent_frames -= latent_frames % chunk_latent_frames
    if latent_frames < chunk_latent_frames or latent_frames % chunk_latent_frames:
        valid = [VAE_STRIDE[0] * (chunk_latent_frames * c - 1) + 1 for c in range(1, 6)]
        raise ValueError(
            f"num_frames {num_frames} does not hold a whole number of {chunk_latent_frames}-latent-frame chunks "
            f"(frame_policy={frame_policy!r}); use one of {valid}, ..."
            + (" or frame_policy='truncate'" if frame_policy == "strict" else "")
        )
    total_chunks = latent_frames // chunk_latent_frames
    per_chunk = [VAE_STRIDE[0] * chunk_latent_frames] * total_chunks
    per_chunk[0] = 1 + VAE_STRIDE[0] * (chunk_latent_frames - 1)  # the causal first latent frame is one frame
    latent_height, latent_width = height // VAE_STRIDE[1], width // VAE_STRIDE[2]
    return SessionShape(
        width=width,
        height=height,
        num_frames=sum(per_chunk),
        requested_frames=num_frames,
        fps=fps,
        frame_policy=frame_policy,
        chunk_latent_frames=chunk_latent_frames,
        latent_height=latent_height,
        latent_width=latent_width,
        latent_frames=latent_frames,
        total_chunks=total_chunks,
        frames_per_chunk=tuple(per_chunk),
        tokens_per_frame=(latent_height // PATCH_SIZE[1]) * (latent_width // PATCH_SIZE[2]),
    )
