"""What the batch video service asks of a model: plan a request, run it with progress and cancellation hooks.

A `VideoRunner` turns a validated `JobRequest` into an MP4 (video, plus audio where the model makes it) and a
`RunOutcome`; how the service calls it is in PROTOCOL.md ("The model side"). Implementations: `minimax.MiniMaxRunner`
(MiniMax H3: video + audio), `wan2_2.Wan22Runner` (Wan 2.2: video, with classifier-free guidance) and
`fake.FakeVideoRunner` (tests, AIPerf CI).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

from telefuser.pipelines.hooks import StepHooks
from ...sizes import parse_size

# The stages a running job passes through, as its video object's `stage` shows them (PROTOCOL.md, "Jobs"): the
# worker sets all but "muxing", which a runner reports (`report_stage`) when it starts writing the MP4.
RUN_STAGES = ("starting", "denoising", "decoding", "muxing", "publishing")


def _no_stage(stage: str) -> None:
    return None


GUIDANCE_FIELDS = ("guidance_scale", "guidance_scale_2", "negative_prompt")  # set only by a model with guidance


@dataclass(frozen=True)
class JobHooks(StepHooks):
    """The pipeline's `StepHooks` plus `stage(name)`, which a runner calls as it enters a stage of `RUN_STAGES` the
    worker cannot see (the MP4 muxing inside `run`)."""

    stage: Callable[[str], None] = _no_stage


def report_stage(hooks: StepHooks, stage: str) -> None:
    """Tell the worker the job entered `stage`; hooks without a `stage` callback (a follower rank's) ignore it."""
    getattr(hooks, "stage", _no_stage)(stage)


class JobCancelled(Exception):
    """Raised by a runner that stopped because `hooks.cancelled()` said so; `step` = denoising calls completed."""

    def __init__(self, step: int):
        super().__init__(f"cancelled after {step} denoising step(s)")
        self.step = step


@dataclass(frozen=True)
class MediaInput:
    """An image, video or audio a request carries (a keyframe or a reference). The job record keeps its `summary()`;
    the bytes (`data`) travel beside it: staged in the artifact store, read back by the worker, broadcast to the
    follower ranks (PROTOCOL.md, "Keyframes, references and LoRAs")."""

    role: str  # "first_frame" | "last_frame" | "reference"
    kind: str  # "image" | "video" | "audio"
    sha256: str  # of `data`: the worker checks what it reads back against it
    size: int  # bytes
    width: int | None = None  # images and videos, as read at submission (after EXIF orientation)
    height: int | None = None
    data: bytes | None = field(default=None, repr=False, compare=False)

    def summary(self) -> dict[str, Any]:
        return {"role": self.role, "kind": self.kind, "bytes": self.size, "sha256": self.sha256,
                "width": self.width, "height": self.height}  # fmt: skip

    @classmethod
    def from_summary(cls, data: dict[str, Any]) -> MediaInput:
        return cls(data["role"], data["kind"], data["sha256"], data["bytes"], data.get("width"), data.get("height"))


@dataclass(frozen=True)
class JobRequest:
    """One generation request, validated; picklable, so rank 0 can broadcast it to follower ranks."""

    prompt: str
    resolution: int | str  # the canvas to generate: "WxH" (explicit) or a short edge in pixels (with aspect_ratio)
    aspect_ratio: str
    seconds: float
    steps: int  # num_inference_steps as the model counts them; its metadata "steps" says how many DiT calls they make
    seed: int
    output_size: str | None = None  # "WxH" to resize and crop the generated frames to (canvas.py); None: as made
    task: str = "t2va"  # "t2va", "fl2va" (keyframes) or "ref2va" (references): what `media` makes it
    preset: str | None = None  # a sampling preset's name (its flow shifts; `steps` is already resolved)
    loras: tuple[tuple[str, float], ...] = ()  # (name in --lora-dir, scale), in merge order
    media: tuple[MediaInput, ...] = ()  # keyframes (first, last) or references, in order
    # classifier-free guidance, set only for a runner whose metadata says "guidance": True (None: the model's default)
    guidance_scale: float | None = None
    guidance_scale_2: float | None = None  # the second expert's (Wan 2.2 T2V-A14B); None: guidance_scale's
    negative_prompt: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, without the media's bytes (their summaries only); guidance fields only when set, so a model
        without guidance records what it always did."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in GUIDANCE_FIELDS:
            if out[name] is None:
                del out[name]
        out["loras"] = [[name, scale] for name, scale in self.loras]
        out["media"] = [m.summary() for m in self.media]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRequest:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["loras"] = tuple((str(name), float(scale)) for name, scale in values.get("loras", ()))
        values["media"] = tuple(MediaInput.from_summary(m) for m in values.get("media", ()))
        return cls(**values)

    def media_data(self) -> list[bytes]:
        """The bytes of every input, in order (what a follower rank receives beside `as_dict()`)."""
        missing = [m.role for m in self.media if m.data is None]
        if missing:
            raise ValueError(f"the job's media were not loaded: {', '.join(missing)}")
        return [m.data for m in self.media]

    def with_media_data(self, blobs: list[bytes]) -> JobRequest:
        """This request with its inputs' bytes, each checked against the sha256 recorded at submission."""
        if len(blobs) != len(self.media):
            raise ValueError(f"the job has {len(self.media)} input(s), {len(blobs)} were found")
        loaded = []
        for media, blob in zip(self.media, blobs):
            if hashlib.sha256(blob).hexdigest() != media.sha256:
                raise ValueError(f"the {media.role} input read back does not match what was submitted (sha256)")
            loaded.append(replace(media, data=blob))
        return replace(self, media=tuple(loaded))

    @property
    def output_dims(self) -> tuple[int, int] | None:
        """(width, height) of output_size, or None."""
        if self.output_size is None:
            return None
        return parse_size(self.output_size, what="output_size")


@dataclass(frozen=True)
class VideoShape:
    """What a job request will produce, known before running it."""

    width: int
    height: int
    frames: int
    fps: int
    duration_s: float  # frames / fps: the model snaps the requested seconds to its frame grid
    dit_calls: int
    output_width: int | None = None  # set by the service when the clip is resized after generation
    output_height: int | None = None
    task: str = "t2va"
    # what the conditions add to a job's memory: ("keyframe" | "image" | "video" | "audio", width, height) each
    conditions: tuple[tuple[str, int | None, int | None], ...] = ()

    @property
    def size(self) -> str:
        """What the client gets: the output size when resized, else the generated canvas."""
        return f"{self.output_width or self.width}x{self.output_height or self.height}"

    @property
    def generated_size(self) -> str:
        return f"{self.width}x{self.height}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunOutcome:
    inference_time_s: float  # generation (text encode + denoise + decode), without muxing the file
    peak_memory_bytes: int
    peak_memory_kind: str  # "cuda_max_memory_allocated" or "process_peak_rss" (see profiling.timing.peak_memory)
    frames: int
    fps: int
    width: int  # of the MP4 (after any resize)
    height: int
    duration_s: float
    dit_calls: int
    # the MP4's audio stream; None for a model that makes no audio (the MP4 then has none)
    audio_channels: int | None = None
    audio_samples: int | None = None
    sample_rate: int | None = None
    dit_calls_skipped: int = 0
    mux_s: float = 0.0  # resize (when asked) and MP4 muxing
    generated_size: str | None = None  # "WxH" the model made, when it differs from width x height
    timings: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # the pipeline's own metrics() where it has them

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class VideoRunner(Protocol):
    model: str  # the served model name (what POST /v1/videos `model` must match)
    # fps, audio (bool; with it sample_rate, audio_channels), size_multiple, steps (how they map to DiT calls),
    # guidance (bool; with it guidance_scale {"default", "min", "max"}), defaults {...}; shown by /v1/service/metadata
    metadata: dict[str, Any]

    def plan(self, job_request: JobRequest) -> VideoShape:
        """Validate and size a request; ValueError with a user-facing message when it cannot be made."""
        ...

    # Optional: `memory_estimate(plan) -> {term: bytes}` (latents, activations, decode...) beyond the weights; with it
    # the service refuses jobs that cannot fit the device (limits.py). Optional metadata: "native_size" (the
    # canvas the model was trained at, "WxH"), "device"; what it runs: "tasks" (default ["t2va"]), "partition",
    # "presets" ({name: {"steps", ...}}), "loras_enabled" (PROTOCOL.md, "The model side").

    def run(self, job_request: JobRequest, output: Path | None, hooks: StepHooks) -> RunOutcome: ...

    def close(self) -> None: ...
