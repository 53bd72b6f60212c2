"""The video service's request limits, derived from the model and the device at start-up (flags override).

The limits, their defaults and flags are in PROTOCOL.md; why the canvas and pixel-second caps are what they are is in
serving/README.md. The size limits apply to the size asked for and to the canvas generated. The media and LoRA limits
are checked by media.py and lora_field.py; they are listed here so that /v1/service/metadata shows them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...sizes import parse_size
from ..common.limits import CanvasLimitFlags, Limit, LimitSet, canvas_limits, pick
from ..common.memory_budget import available_memory, gib
from .contract import VideoShape, JobRequest
from .lora_field import LoraPolicy
from .media import MediaLimits

TEXT_BODY_BYTES = 1 << 20  # a request without media: its text fields, with room to spare


@dataclass
class VideoLimitFlags(CanvasLimitFlags):
    max_pixel_seconds: float | None = None
    max_job_memory_gib: float | None = None


def _native(runner) -> tuple[int, int]:
    meta = runner.metadata
    text = str(meta.get("native_size") or meta.get("defaults", {}).get("size") or "1344x768")
    return parse_size(text, what="the runner's native size")


def derive_video_limits(
    runner,
    *,
    max_seconds: float,
    max_steps: int,
    max_body_bytes: int | None,
    flags: VideoLimitFlags | None = None,
    media: MediaLimits | None = None,
    loras: LoraPolicy | None = None,
) -> LimitSet:
    flags, media, loras = flags or VideoLimitFlags(), media or MediaLimits(), loras or LoraPolicy()
    width, height = _native(runner)
    limits = canvas_limits(
        (width, height), max_width=flags.max_width, max_height=flags.max_height, max_pixels=flags.max_pixels
    )
    limits.append(Limit("max_seconds", float(max_seconds), "--max-seconds", "service flag"))
    task = runner.metadata.get("tasks", ["t2va"])[0]  # one this runner runs (a Ref2VA server runs no t2va)
    longest = runner.plan(JobRequest("limits", f"{width}x{height}", "16:9", float(max_seconds), 2, 0, task=task))
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
    limits += _media_limits(runner, max_body_bytes, media)
    if runner.metadata.get("loras_enabled"):
        limits.append(Limit("max_loras", loras.max_loras, "--max-loras", "service flag"))
        scales = [loras.min_scale, loras.max_scale]
        limits.append(Limit("lora_scale_range", scales, "--lora-scale-range", "service flag"))
    return LimitSet(limits)


def _media_limits(runner, max_body_bytes: int | None, media: MediaLimits) -> list[Limit]:
    """The body limit, and for a model that takes keyframes or references what each file may be. The body's default
    holds the text, two images and one video or audio at their limits, base64-encoded (4/3 of the bytes)."""
    from telefuser.pipelines.minimax_h3.conditions import MAX_REFERENCES

    takes_media = set(runner.metadata.get("tasks", ("t2va",))) != {"t2va"}
    encoded = TEXT_BODY_BYTES + (media.max_clip_bytes + 2 * media.max_image_bytes) * 4 // 3
    default, why = (encoded, "text + 2 images + 1 clip, base64") if takes_media else (TEXT_BODY_BYTES, "text only")
    body = pick("max_body_bytes", "--max-body-mib", max_body_bytes, default, f"service default: {why}")
    if not takes_media:
        return [body]
    return [
        body,
        Limit("max_image_bytes", media.max_image_bytes, "--max-image-mib", "service flag"),
        Limit("max_image_pixels", media.max_image_pixels, "--max-image-pixels", "service flag"),
        Limit("max_clip_bytes", media.max_clip_bytes, "--max-clip-mib", "service flag"),
        Limit("max_video_pixels", media.max_video_pixels, "(fixed)", "a video reference's frames: 1080p"),
        Limit("max_references", MAX_REFERENCES, "(model)", "model: 9 images, 3 videos, 3 audio, 12 in all"),
    ]


def check_video_plan(limits: LimitSet, plan: VideoShape, runner) -> None:
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
