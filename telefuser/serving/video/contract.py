"""What the batch video service asks of a model: plan a request, run it with progress and cancellation hooks.

A `VideoRunner` turns a validated `VideoSpec` into an MP4 (video + audio) and a `RunOutcome`; how the service calls
it is in PROTOCOL.md ("The model side"). Implementations: `minimax.MiniMaxRunner` (the real model) and
`fake.FakeVideoRunner` (tests, AIPerf CI).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from telefuser.pipelines.hooks import StepHooks


class JobCancelled(Exception):
    """Raised by a runner that stopped because `hooks.cancelled()` said so; `step` = denoising calls completed."""

    def __init__(self, step: int):
        super().__init__(f"cancelled after {step} denoising step(s)")
        self.step = step


@dataclass(frozen=True)
class VideoSpec:
    """One generation request, validated; picklable, so rank 0 can broadcast it to follower ranks."""

    prompt: str
    resolution: int | str  # the canvas to generate: "WxH" (explicit) or a short edge in pixels (with aspect_ratio)
    aspect_ratio: str
    seconds: float
    steps: int  # sigma points (MiniMax convention): steps - 1 DiT calls
    seed: int
    output_size: str | None = None  # "WxH" to resize and crop the generated frames to (canvas.py); None: as made

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VideoSpec:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @property
    def output_dims(self) -> tuple[int, int] | None:
        """(width, height) of output_size, or None."""
        if self.output_size is None:
            return None
        width, height = self.output_size.lower().split("x")
        return int(width), int(height)


@dataclass(frozen=True)
class VideoPlan:
    """What a spec will produce, known before running it."""

    width: int
    height: int
    frames: int
    fps: int
    duration_s: float  # frames / fps: the model snaps the requested seconds to its frame grid
    dit_calls: int
    output_width: int | None = None  # set by the service when the clip is resized after generation
    output_height: int | None = None

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
    audio_channels: int
    audio_samples: int
    sample_rate: int
    dit_calls: int
    dit_calls_skipped: int = 0
    mux_s: float = 0.0  # resize (when asked) and MP4 muxing
    generated_size: str | None = None  # "WxH" the model made, when it differs from width x height
    timings: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # the pipeline's own metrics() where it has them

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class VideoRunner(Protocol):
    model: str  # the served model name (what POST /v1/videos `model` must match)
    metadata: dict[str, Any]  # fps, sample_rate, size_multiple, guidance, defaults {...}; shown by /v1/service/metadata

    def plan(self, spec: VideoSpec) -> VideoPlan:
        """Validate and size a request; ValueError with a user-facing message when it cannot be made."""
        ...

    # Optional: `memory_estimate(plan) -> {term: bytes}` (latents, activations, decode...) beyond the weights; with it
    # the service refuses jobs that cannot fit the device (limits.py). Optional metadata: "native_size" (the
    # canvas the model was trained at, "WxH"), "device".

    def run(self, spec: VideoSpec, output: Path | None, hooks: StepHooks) -> RunOutcome: ...

    def close(self) -> None: ...
