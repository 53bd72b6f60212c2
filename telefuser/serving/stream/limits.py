"""The streaming service's request limits, derived from the model and the device at start-up (flags override).

The limits, their defaults and flags are in PROTOCOL.md; how a session's memory is counted is in serving/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.limits import CanvasLimitFlags, Limit, LimitSet, amount, canvas_limits, pick
from ..common.memory_budget import available_memory, gib
from .contract import parse_resolution

STREAM_SECONDS = 600  # the longest session, in seconds of video at the model's frame rate
POOL = "session_memory_budget_bytes"  # the memory all open sessions' estimates share
IMAGE_PIXELS = 40_000_000  # a 40-megapixel photo: 120 MB decoded; the image is resized to the canvas anyway


@dataclass
class StreamLimitFlags(CanvasLimitFlags):
    max_session_memory_gib: float | None = None
    max_image_pixels: int | None = None


def derive_stream_limits(
    factory, *, max_sessions: int, max_body_bytes: int, flags: StreamLimitFlags | None = None
) -> LimitSet:
    flags = flags or StreamLimitFlags()
    meta = getattr(factory, "metadata", {}) or {}
    defaults = meta.get("defaults", {})
    native = parse_resolution(meta.get("native_resolution") or defaults.get("resolution") or "832x480")
    fps = float(defaults.get("fps") or meta.get("fps") or 16)
    limits = canvas_limits(native, max_width=flags.max_width, max_height=flags.max_height, max_pixels=flags.max_pixels)
    limits.append(
        pick(
            "max_frames",
            "--max-frames",
            flags.max_frames,
            int(STREAM_SECONDS * fps),
            f"model: {STREAM_SECONDS // 60} minutes at its {fps:g} fps",
        )
    )
    if callable(getattr(factory, "memory_estimate", None)):
        budget = available_memory(meta.get("device"))
        memory = pick(
            "max_session_memory_bytes",
            "--max-session-memory-gib",
            gib(flags.max_session_memory_gib),
            budget.bytes // max_sessions,
            f"device: {budget.source} / {max_sessions} session slot(s)",
        )
        # All open sessions together; it binds only when --max-session-memory-gib promises more than a slot's share.
        pool = Limit(POOL, budget.bytes, "measured at start-up", f"device: {budget.source}")
    else:
        memory = Limit("max_session_memory_bytes", None, "--max-session-memory-gib", "the model gives no estimate")
        pool = Limit(POOL, None, "measured at start-up", "the model gives no estimate")
    limits += [memory, pool]
    limits.append(
        pick(
            "max_image_pixels",
            "--max-image-pixels",
            flags.max_image_pixels,
            IMAGE_PIXELS,
            "service: a 40-megapixel photo (120 MB decoded)",
        )
    )
    limits.append(Limit("max_body_bytes", max_body_bytes, "--max-body-mib", "service default"))
    return LimitSet(limits)


def check_stream_config(limits: LimitSet, config: dict[str, Any]) -> None:
    """The model-independent bounds of an effective config (defaults applied); 422 naming the limit."""
    if config.get("resolution") is not None:
        width, height = parse_resolution(config["resolution"])
        limits.check_canvas(width, height, f"resolution {width}x{height}")
    frames = config.get("num_frames")
    if isinstance(frames, int) and frames > limits.value("max_frames"):
        raise limits["max_frames"].refusal(f"num_frames is {amount(frames)}")


def delivery_bytes(config: dict[str, Any], chunk_frames: int, buffer_chunks: int) -> int:
    """Raw RGB of the chunks the service holds for one session: the queue, one being encoded, one being sent."""
    width, height = parse_resolution(config["resolution"])
    return (buffer_chunks + 2) * chunk_frames * width * height * 3
