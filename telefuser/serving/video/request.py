"""Parsing `POST /v1/videos`: JSON, multipart/form-data (AIPerf's and the OpenAI SDK's) or urlencoded -> a
`JobRequest`.

Form text and JSON values are coerced the same way (form.py reads the body); every failure is a `RequestError` whose
message names the field and what is allowed. The cheap fields are checked first, the media last (inputs.py, media.py);
the LoRA field is lora_field.py's. What can be made is the runner's `plan()`, what the service allows is
`VideoPolicy`, the bounds from the model and device are limits.py's; a size off the model's grid is resized
(canvas.py).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from telefuser.pipelines.minimax_h3.conditions import keyframe_canvas

from ..common.http_errors import RequestError
from ..common.limits import amount
from ..common.request_body import MAX_PROMPT_CHARS, MAX_SEED, check_prompt, short_repr
from .canvas import generation_canvas
from .contract import JobRequest
from .form import Upload, read_fields
from .inputs import MEDIA_FIELDS, check_task, media_fields, read_inputs, requested_task
from .lora_field import LoraPolicy, parse_loras
from .media import MediaLimits

FIELDS = (
    "prompt", "model", "size", "resolution", "aspect_ratio", "seconds", "num_frames", "fps", "num_inference_steps",
    "steps", "seed", "guidance_scale", "guidance_scale_2", "negative_prompt", "input_reference", "last_frame",
    "references", "lora", "preset",
)  # fmt: skip
REFUSED = {
    "image": "'image' is not a field here: send the first keyframe as 'input_reference' (or images in 'references')",
}
MIN_SIDE = 16  # of the MP4; it must also be even (H.264 4:2:0)
_SIZE = re.compile(r"^\s*(\d{1,6})\s*[xX\u00d7]\s*(\d{1,6})\s*$")


@dataclass(frozen=True)
class VideoPolicy:
    """What this service accepts; built from the runner's metadata plus the server options."""

    model: str
    max_seconds: float
    model_aliases: tuple[str, ...] = ()  # other names a request's 'model' may give (a fake: the model it stands for)
    fps: int = 24
    size_multiple: int = 32
    max_steps: int = 1000
    guidance: bool = False  # False: the model has no classifier-free guidance (guidance_scale / negative_prompt)
    guidance_range: tuple[float, float] = (1.0, 20.0)  # the guidance_scale a request may give (with guidance)
    experts: int = 1  # DiTs taking turns (Wan 2.2 T2V-A14B: 2); with 2, guidance_scale_2 sets the second one's scale
    steps_rule: str | None = None  # how the model counts steps (its metadata "steps"), for the refusals
    defaults: dict[str, Any] = field(default_factory=dict)  # size, seconds, steps, seed, aspect_ratio
    max_frames: int | None = None  # an explicit num_frames past this is refused before any arithmetic on it
    tasks: tuple[str, ...] = ("t2va",)  # what the model runs: "t2va", "fl2va" (keyframes), "ref2va" (references)
    partition: str | None = None  # MiniMax H3's DiT partition served (--task-partition); None: text only
    presets: dict[str, int] = field(default_factory=dict)  # sampling preset -> its steps
    media: MediaLimits = field(default_factory=MediaLimits)
    loras: LoraPolicy = field(default_factory=LoraPolicy)

    @classmethod
    def from_runner(
        cls,
        runner,
        *,
        max_seconds: float,
        max_steps: int = 1000,
        max_frames: int | None = None,
        media: MediaLimits | None = None,
        loras: LoraPolicy | None = None,
    ) -> VideoPolicy:
        meta = runner.metadata
        presets = {name: int(preset["steps"]) for name, preset in meta.get("presets", {}).items()}
        stands_in_for = meta.get("stands_in_for") if meta.get("fake") else None
        return cls(
            model=runner.model,
            model_aliases=(stands_in_for,) if stands_in_for else (),
            max_seconds=float(max_seconds),
            fps=int(meta.get("fps", 24)),
            size_multiple=int(meta.get("size_multiple", 32)),
            max_steps=int(max_steps),
            guidance=bool(meta.get("guidance", False)),
            guidance_range=_guidance_range(meta),
            experts=int(meta.get("experts", 1)),
            steps_rule=meta.get("steps"),
            defaults=dict(meta.get("defaults", {})),
            max_frames=max_frames,
            tasks=tuple(meta.get("tasks", ("t2va",))),
            partition=meta.get("partition"),
            presets=presets,
            media=media or MediaLimits(),
            loras=dataclasses.replace(loras or LoraPolicy(), enabled=bool(meta.get("loras_enabled"))),
        )

    def model_names(self) -> set[str]:
        """What a request's 'model' may say, lower-cased."""
        return {name.lower() for name in (self.model, *self.model_aliases)}


def _guidance_range(meta: dict[str, Any]) -> tuple[float, float]:
    bounds = meta.get("guidance_scale") or {}
    return float(bounds.get("min", 1.0)), float(bounds.get("max", 20.0))


@dataclass(frozen=True)
class VideoRequest:
    job_request: JobRequest
    model: str
    fields: dict[str, Any]  # what the client sent, for the job record
    num_frames: int | None  # when given, the plan must produce exactly this many frames


def parse_video_request(content_type: str, body: bytes, policy: VideoPolicy) -> VideoRequest:
    raw = read_fields(content_type, body)
    for name, reason in REFUSED.items():
        if raw.get(name) not in (None, ""):
            raise RequestError(422, reason)
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        named = ", ".join(short_repr(name, 40) for name in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise RequestError(422, f"unknown field(s) {named}; accepted: {', '.join(FIELDS)}")
    given = {k: _text(k, v) for k, v in raw.items() if v is not None and v != ""}  # null / empty: not given

    prompt = check_prompt(given.get("prompt"))

    model = given.get("model")
    if model is not None and str(model).strip().lower() not in policy.model_names():
        raise RequestError(
            422, f"model {short_repr(model)} is not served here; this server serves {policy.model!r}", param="model"
        )

    guidance_scale, guidance_scale_2, negative_prompt = _guidance(given, policy)
    if "fps" in given:
        fps = _number("fps", given["fps"])
        if fps != policy.fps:
            raise RequestError(
                422, f"'fps' must be {policy.fps} (the model's fixed frame rate), got {short_repr(given['fps'])}"
            )

    preset = _preset(given, policy)
    steps = _steps(given, policy, preset)
    seed = _integer("seed", given.get("seed", policy.defaults.get("seed", 0)))
    if not 0 <= seed <= MAX_SEED:
        raise RequestError(422, f"'seed' must be between 0 and {MAX_SEED}, got {amount(seed)}")

    num_frames = _integer("num_frames", given["num_frames"]) if "num_frames" in given else None
    if num_frames is not None and num_frames < 1:
        raise RequestError(422, f"'num_frames' must be a positive integer, got {amount(num_frames)}")
    max_frames = policy.max_frames if policy.max_frames is not None else 10**9
    if num_frames is not None and num_frames > max_frames:
        raise RequestError(
            422, f"'num_frames' is {amount(num_frames)}; the limit is max_frames={max_frames:,} (--max-frames)"
        )
    if "seconds" in given:
        seconds = _number("seconds", given["seconds"])
    elif num_frames is not None:
        seconds = num_frames / policy.fps
    else:
        seconds = float(policy.defaults.get("seconds", 5.0))
    if seconds <= 0:
        raise RequestError(422, f"'seconds' must be positive, got {short_repr(given.get('seconds'))}")
    if seconds > policy.max_seconds:
        raise RequestError(
            422,
            f"'seconds' is {seconds:g}; this server allows at most {policy.max_seconds:g} s (its operator can raise "
            f"that with --max-seconds)",
            param="seconds",
        )

    loras = parse_loras(given.get("lora"), policy.loras)
    sent = media_fields(given)
    check_task(requested_task(given), policy.tasks, policy.partition, sent)  # before any upload is decoded
    inputs = read_inputs(given, policy.media)  # last: the only expensive check (it decodes the images)
    check_task(inputs.task, policy.tasks, policy.partition, sent)
    anchor = next(((m.width, m.height) for m in inputs.media if m.role != "reference"), None)
    resolution, aspect_ratio, output_size = _canvas(given, policy, anchor)

    job_request = JobRequest(
        prompt=prompt,
        resolution=resolution,
        aspect_ratio=aspect_ratio,
        seconds=float(seconds),
        steps=steps,
        seed=seed,
        output_size=output_size,
        task=inputs.task,
        preset=preset,
        loras=loras,
        media=inputs.media,
        guidance_scale=guidance_scale,
        guidance_scale_2=guidance_scale_2,
        negative_prompt=negative_prompt,
    )
    fields = {**given, **inputs.described}  # the media as summaries: no megabytes of base64 in the record
    return VideoRequest(job_request=job_request, model=policy.model, fields=fields, num_frames=num_frames)


def check_plan(request: VideoRequest, plan) -> None:
    """After the runner planned the request: an explicit num_frames must be what the model makes."""
    if request.num_frames is not None and plan.frames != request.num_frames:
        raise RequestError(
            422,
            f"'num_frames' {request.num_frames} is not a frame count this model makes (its "
            f"grid is in /v1/service/metadata); the next one up is {plan.frames}",
        )


def _guidance(given: dict[str, Any], policy: VideoPolicy) -> tuple[float | None, float | None, str | None]:
    """(guidance_scale, guidance_scale_2, negative_prompt) for the job request; None where not given (the model's
    default; guidance_scale_2, the second expert's, defaults to guidance_scale when that is given). A model without
    guidance takes only the values that change nothing (1.0, an empty negative prompt), and records none."""
    scale = _number("guidance_scale", given["guidance_scale"]) if "guidance_scale" in given else None
    scale_2 = _number("guidance_scale_2", given["guidance_scale_2"]) if "guidance_scale_2" in given else None
    negative = given.get("negative_prompt")
    if not policy.guidance:
        why = f"{policy.model} samples without classifier-free guidance (one DiT call per step)"
        for name, value in (("guidance_scale", scale), ("guidance_scale_2", scale_2)):
            if value is not None and value != 1.0:
                raise RequestError(422, f"'{name}' cannot be honoured: {why}; omit it or send 1.0", param=name)
        if negative is not None and (not isinstance(negative, str) or negative.strip()):
            raise RequestError(422, f"'negative_prompt' cannot be honoured: {why}; omit it or send an empty string")
        return None, None, None
    if scale_2 is not None and policy.experts < 2:
        raise RequestError(
            422,
            f"'guidance_scale_2' is the second expert's scale; {policy.model} has one DiT: use 'guidance_scale'",
            param="guidance_scale_2",
        )
    low, high = policy.guidance_range
    for name, value in (("guidance_scale", scale), ("guidance_scale_2", scale_2)):
        if value is not None and not low <= value <= high:
            raise RequestError(
                422,
                f"'{name}' must be between {low:g} and {high:g} ({low:g}: no classifier-free guidance), got {value:g}",
                param=name,
            )
    if scale_2 is not None and scale is not None and scale <= 1.0:  # diffusers' WanPipeline decides on the first
        raise RequestError(
            422,
            f"'guidance_scale_2' has no effect at guidance_scale {scale:g}: classifier-free guidance is off for the "
            "whole request; raise 'guidance_scale' or omit 'guidance_scale_2'",
            param="guidance_scale_2",
        )
    if negative is not None and not isinstance(negative, str):
        raise RequestError(422, f"'negative_prompt' must be a string, got {type(negative).__name__}")
    if negative is None or not negative.strip():
        return scale, scale_2, None
    if len(negative) > MAX_PROMPT_CHARS:
        raise RequestError(422, f"'negative_prompt' is {len(negative)} characters; the limit is {MAX_PROMPT_CHARS}")
    if scale is not None and scale <= 1.0:  # no unconditional pass for it to steer
        raise RequestError(
            422,
            f"'negative_prompt' has no effect at guidance_scale {scale:g} (no classifier-free guidance); raise "
            "'guidance_scale' or omit the negative prompt",
            param="negative_prompt",
        )
    return scale, scale_2, negative


def _canvas(
    given: dict[str, Any], policy: VideoPolicy, anchor: tuple[int, int] | None = None
) -> tuple[int | str, str, str | None]:
    """(resolution, aspect_ratio, output_size) for the pipeline: an explicit "WxH" (generated on the nearest grid
    canvas and resized when it is off the grid), or a short edge with an aspect ratio. With a keyframe (`anchor`:
    its width, height) and no explicit size or ratio, the keyframe's aspect ratio, as the pipeline's "auto" takes it:
    at the short edge given, else at the default size's."""
    if "size" in given and "resolution" in given:
        raise RequestError(422, "give 'size' (WxH) or 'resolution', not both")
    aspect = given.get("aspect_ratio")
    if aspect is not None and not isinstance(aspect, str):
        raise RequestError(422, f"'aspect_ratio' must be a string such as '16:9', got {short_repr(aspect)}")
    if aspect == "auto" and anchor is None:
        raise RequestError(422, "'aspect_ratio' 'auto' takes the keyframe's; this request has no keyframe")
    value = given.get("size", given.get("resolution"))
    name = "size" if "size" in given else "resolution"
    if anchor is not None and "size" not in given and aspect in (None, "auto"):
        return _keyframe_canvas(value, anchor, policy), "16:9", None
    if value is None:
        value, name = policy.defaults.get("size", "1344x768"), "size"
        if aspect is not None:
            raise RequestError(422, "'aspect_ratio' needs 'resolution' (a short edge in pixels) to apply to")
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise RequestError(422, f"'{name}' must be WIDTHxHEIGHT such as '1280x720', got {short_repr(value)}")
    text = str(value).strip()
    match = _SIZE.match(text)
    if match:
        if aspect is not None:
            raise RequestError(
                422,
                f"'aspect_ratio' applies only to a short-edge 'resolution'; {name}={text!r} already fixes the canvas",
            )
        width, height = int(match.group(1)), int(match.group(2))
        if width <= 0 or height <= 0:
            raise RequestError(422, f"'{name}' must be positive, got {text!r}")
        if width < MIN_SIDE or height < MIN_SIDE or width % 2 or height % 2:
            raise RequestError(
                422, f"'{name}' {width}x{height}: both sides must be even (H.264 4:2:0) and at least {MIN_SIDE}"
            )
        canvas = generation_canvas(width, height, policy.size_multiple)
        output = f"{width}x{height}" if canvas != (width, height) else None
        return f"{canvas[0]}x{canvas[1]}", str(policy.defaults.get("aspect_ratio", "16:9")), output
    if name == "size" or not text.isdigit() or len(text) > 6:
        alternative = " or a short edge in pixels" if name == "resolution" else ""
        raise RequestError(
            422, f"'{name}' must be WIDTHxHEIGHT such as '1280x720'{alternative}, got {short_repr(value)}"
        )
    return int(text), aspect or str(policy.defaults.get("aspect_ratio", "16:9")), None


def _keyframe_canvas(resolution: Any, anchor: tuple[int, int], policy: VideoPolicy) -> str:
    """ "WxH": the keyframe's aspect ratio at a short edge (`resolution`, else the default size's)."""
    if resolution is None:
        default = _SIZE.match(str(policy.defaults.get("size", "1344x768")))
        short_edge = min(int(default.group(1)), int(default.group(2))) if default else 768
    elif isinstance(resolution, (int, str)) and not isinstance(resolution, bool) and str(resolution).strip().isdigit():
        short_edge = int(str(resolution).strip()[:7])
    else:
        raise RequestError(
            422, f"'resolution' beside a keyframe is a short edge in pixels, got {short_repr(resolution)}"
        )
    if short_edge <= 0 or short_edge % policy.size_multiple:
        raise RequestError(422, f"'resolution' {short_edge} must be a positive multiple of {policy.size_multiple}")
    try:
        height, width = keyframe_canvas(*anchor, short_edge, policy.size_multiple)
    except ValueError:  # the rule's own message names MiniMax H3; the service applies it to every model
        raise RequestError(
            422,
            f"the keyframe's aspect ratio {anchor[0]}:{anchor[1]} is outside 1:4 .. 4:1, where a canvas is derived "
            "from it; give 'size' (WIDTHxHEIGHT) to set the canvas",
        ) from None
    return f"{width}x{height}"


def _preset(given: dict[str, Any], policy: VideoPolicy) -> str | None:
    name = given.get("preset")
    if name is None:
        return None
    if not isinstance(name, str) or name not in policy.presets:
        known = ", ".join(policy.presets) or "none (this model has no presets)"
        raise RequestError(422, f"unknown preset {short_repr(name)}; presets: {known}")
    return name


def _steps(given: dict[str, Any], policy: VideoPolicy, preset: str | None = None) -> int:
    values = {k: _integer(k, given[k]) for k in ("num_inference_steps", "steps") if k in given}
    if len(set(values.values())) > 1:
        raise RequestError(422, f"'num_inference_steps' and 'steps' disagree: {values}")
    steps = next(iter(values.values()), None)
    if steps is None and preset is not None:  # an explicit step count wins over the preset's
        steps = policy.presets[preset]
    if steps is None:
        steps = int(policy.defaults.get("steps", 50))
    name = next(iter(values), "num_inference_steps")
    if steps < 2:
        rule = f" ({policy.steps_rule})" if policy.steps_rule else ""
        raise RequestError(422, f"'{name}' must be at least 2{rule}, got {amount(steps)}")
    if steps > policy.max_steps:
        raise RequestError(422, f"'{name}' is {amount(steps)}; this server allows at most {policy.max_steps}")
    return steps


def _text(name: str, value: Any) -> Any:
    """A file part sent for a text field is read as its text (clients that upload every field); media stay bytes."""
    if not isinstance(value, Upload) or name in MEDIA_FIELDS:
        return value
    try:
        return value.data.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(400, f"form field {name!r} is not UTF-8 text") from None


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise RequestError(422, f"'{name}' must be a number, got {value!r}")
    try:
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str) and len(value) <= 64:
            number = float(value.strip())
        elif isinstance(value, str):
            raise ValueError(value)
        else:
            raise RequestError(422, f"'{name}' must be a number, got {type(value).__name__}")
    except ValueError:
        raise RequestError(422, f"'{name}' must be a number, got {short_repr(value)}") from None
    except OverflowError:  # an integer past a float's range
        raise RequestError(422, f"'{name}' must be a finite number, got {short_repr(value)}") from None
    if not math.isfinite(number):
        raise RequestError(422, f"'{name}' must be a finite number, got {short_repr(value)}")
    return number


def _integer(name: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        if len(value.strip()) > 30:
            raise RequestError(422, f"'{name}' has {len(value.strip())} digits; no limit here needs more than 20")
        return int(value)  # exact, also past 2**53 (seeds)
    number = _number(name, value)
    if number != int(number):
        raise RequestError(422, f"'{name}' must be an integer, got {short_repr(value)}")
    return int(number)
