"""The video service's request limits, derived from the model and the device at start-up (flags override).

The limits, their defaults and flags are in PROTOCOL.md; why the canvas and pixel-second caps are what they are is in
serving/README.md. The size limits apply to the size asked for and to the canvas generated.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.limits import CanvasLimitFlags, Limit, LimitSet, canvas_limits, pick
from ..common.memory_budget import available_memory, gib
from .contract import VideoPlan, VideoSpec


@dataclass
class VideoLimitFlags(CanvasLimitFlags):
    max_pixel_seconds: float | None = None
    max_job_memory_gib: float | None = None


def _native(runner) -> tuple[int, int]:
    meta = runner.metadata
    text = str(meta.get("native_size") or meta.get("defaults", {}).get("size") or "1344x768")
    width, height = text.lower().split("x")
    return int(width), int(height)


def derive_video_limits(
    runner, *, max_seconds: float, max_steps: int, max_body_bytes: int, flags: VideoLimitFlags | None = None
) -> LimitSet:
    flags = flags or VideoLimitFlags()
    width, height = _native(runner)
    limits = canvas_limits(
        (width, height), max_width=flags.max_width, max_height=flags.max_height, max_pixels=flags.max_pixels
    )
    limits.append(Limit("max_seconds", float(max_seconds), "--max-seconds", "service flag"))
    longest = runner.plan(VideoSpec("limits", f"{width}x{height}", "16:9", float(max_seconds), 2, 0))
    limits.append(
        pick(
            "max_frames",
            "--max-frames",
            flags.max_frames,
            longest.frames,
            f"model: the frames it makes for {max_seconds:g} s",
        )
    )
    limits.append(
        pick(
            "max_pixel_seconds",
            "--max-pixel-seconds",
            flags.max_pixel_seconds,
            float(width * height * max_seconds),
            f"model: its {width}x{height} canvas for {max_seconds:g} s",
        )
    )
    limits.append(Limit("max_steps", int(max_steps), "--max-steps", "service flag"))
    if callable(getattr(runner, "memory_estimate", None)):
        budget = available_memory(runner.metadata.get("device"))
        limits.append(
            pick(
                "max_job_memory_bytes",
                "--max-job-memory-gib",
                gib(flags.max_job_memory_gib),
                budget.bytes,
                f"device: {budget.source}",
            )
        )
    else:
        limits.append(Limit("max_job_memory_bytes", None, "--max-job-memory-gib", "the model gives no estimate"))
    limits.append(Limit("max_body_bytes", int(max_body_bytes), "--max-body-mib", "service default"))
    return LimitSet(limits)


def check_video_plan(limits: LimitSet, plan: VideoPlan, runner) -> None:
    """Bounds of a planned job (the canvas the model makes, its frames, pixel-seconds, memory); 422 naming the limit."""
    limits.check_canvas(plan.width, plan.height, f"the generated canvas {plan.generated_size}")
    if plan.frames > limits.value("max_frames"):
        raise limits["max_frames"].refusal(f"the clip has {plan.frames:,} frames")
    pixel_seconds = plan.width * plan.height * plan.duration_s
    if pixel_seconds > limits.value("max_pixel_seconds"):
        raise limits["max_pixel_seconds"].refusal(
            f"{plan.generated_size} for {plan.duration_s:.3f} s is {pixel_seconds:,.0f} pixel-seconds",
            shown=f"{limits.value('max_pixel_seconds'):,.0f}",
        )
    estimate = getattr(runner, "memory_estimate", None)
    if callable(estimate) and limits.value("max_job_memory_bytes") is not None:
        terms = dict(estimate(plan))
        if plan.output_width is not None:
            terms["resize"] = plan.frames * plan.output_width * plan.output_height * 3
        limits.check_memory(terms, f"a {plan.generated_size} clip of {plan.frames} frames", "max_job_memory_bytes")
