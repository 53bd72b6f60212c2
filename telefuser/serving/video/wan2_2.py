"""The video service's Wan 2.2 runner: text (+ a first frame, TI2V-5B) -> video (no audio), with classifier-free
guidance, behind `VideoRunner`.

One runner serves either released variant (`telefuser serve --model wan2.2-t2v-a14b` or `wan2.2-ti2v-5b`) over
`Wan22Pipeline`. A request's canvas is on the variant's grid (multiples of 16 for T2V-A14B's Wan 2.1 VAE, 32 for
TI2V-5B's Wan 2.2 VAE), its seconds snap up to 4n+1 frames at the release's frame rate, and one step is one DiT call
(the guided pair batched). `guidance_scale` applies to both experts, as diffusers' `guidance_scale_2` defaults to it;
left out, each expert keeps the release's. TI2V-5B takes the first frame as `input_reference` (an `fl2va` job: the
image is decoded and stretched onto the canvas, then held as the first latent frame); T2V-A14B takes text only. No
last frames, references, presets or LoRAs. The memory plan is
made at start-up for the default job (`--offload`, `--gpu-memory-gb`: the workload in pipelines/wan2_2/loading.py); each job's
`memory_estimate` comes from the same workload under the service's placement. Under torchrun every
rank builds the same runner on its share of the Ulysses mesh and rank 0 replays each job on the others (replay.py),
as for MiniMax H3.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from pathlib import Path
from typing import Any

from telefuser.pipelines.hooks import GenerationCancelled, StepHooks
from telefuser.pipelines.minimax_h3.shapes import ASPECT_RATIOS  # the service's named ratios (PROTOCOL.md)

from ...sizes import parse_size
from ..common.http_errors import RequestError
from ..common.startup import StartupError
from ..common.warmup import warmup_wanted
from .canvas import write_clip
from .contract import JobCancelled, RunOutcome, VideoShape, JobRequest, report_stage
from .inputs import KEYFRAME_FIELDS
from .media import MediaLimits, open_image

log = logging.getLogger(__name__)
FRAME_STEP = 4  # the VAEs' temporal stride: clips are 4n+1 frames (the first frame, then 4 per latent frame)
GUIDANCE_RANGE = (1.0, 20.0)  # 1.0: no classifier-free guidance; the releases sample at 3 to 5
FIRST_FRAME = "input_reference"  # the request field of TI2V-5B's image (the first keyframe's, as for MiniMax H3)
FIELD_OF_ROLE = {**{role: field for field, role in KEYFRAME_FIELDS.items()}, "reference": "references"}


def frame_count(seconds: float, fps: int) -> int:
    """The frames made for `seconds` at `fps`: snapped up to 4n+1."""
    frames = max(1, round(seconds * fps))
    return frames + (1 - frames) % FRAME_STEP


def canvas(resolution: int | str, aspect_ratio: str, multiple: int) -> tuple[int, int]:
    """(width, height) of "WxH", or of a short edge at a named aspect ratio (the long edge rounded to `multiple`)."""
    if isinstance(resolution, str) and "x" in resolution.lower():
        return parse_size(resolution, what="resolution", example="1280x720")
    short = int(resolution)
    if short <= 0 or short % multiple:
        raise ValueError(f"'resolution' {short} must be a positive multiple of {multiple}")
    if aspect_ratio not in ASPECT_RATIOS:
        raise ValueError(f"unknown aspect ratio {aspect_ratio!r}; choose one of {', '.join(ASPECT_RATIOS)}")
    ratio = ASPECT_RATIOS[aspect_ratio]
    long = max(multiple, round(short * max(ratio, 1 / ratio) / multiple) * multiple)
    return (long, short) if ratio >= 1 else (short, long)


class Wan22Runner:
    def __init__(
        self,
        pipeline,
        *,
        model: str,
        defaults: dict[str, Any],
        info: dict[str, Any] | None = None,
        memory_plan=None,
        memory=None,
        media_limits: MediaLimits | None = None,
    ):
        """`pipeline`: a `Wan22Pipeline` (its `release` says the variant and how it samples); `defaults`: size,
        seconds, steps, seed for a request that leaves them out. `memory_plan`: the service's `memory.plan.MemoryPlan`
        (its placement); `memory(request)`: the model's workload of one request, for each job's estimate.
        `media_limits`: the bounds a first frame is decoded within (TI2V-5B)."""
        from telefuser.models.wan2_2.config import release as official

        self._pipe = pipeline
        self._memory_plan, self._memory = memory_plan, memory
        self.media_limits = media_limits or MediaLimits()
        self._lock = threading.Lock()  # one job at a time: a pipeline call is not reentrant
        self.model = model
        self.defaults = dict(defaults)
        variant = pipeline.release
        self.size_multiple = variant.vae_scale * 2  # the VAE's stride times the DiT's 2x2 patch
        native = official(variant.name).size  # the limits follow the release's canvas, also for tiny weights
        takes_image = variant.takes_image
        self.metadata = {
            "model": model,
            "runner": f"Wan 2.2 {variant.name.upper()} text {'(+ first frame) ' if takes_image else ''}to video "
            "(no audio)",
            "weights": pipeline.weights.get("summary", ""),
            "native_size": f"{native[0]}x{native[1]}",
            **(info or {}),
            "fps": variant.fps,
            "audio": False,
            "size_multiple": self.size_multiple,
            "frame_grid": f"4n+1 frames at {variant.fps} fps (requested seconds are snapped up)",
            "steps": "num_inference_steps = N UniPC steps -> N DiT calls (a guided step batches its pair)",
            "guidance": True,
            "guidance_scale": {
                "default": list(variant.guidance),  # (high-noise expert, low-noise expert)
                "min": GUIDANCE_RANGE[0],
                "max": GUIDANCE_RANGE[1],
                "applies_to": "both experts unless guidance_scale_2 sets the low-noise one's"
                if variant.experts == 2
                else "the DiT",
            },
            "negative_prompt_default": "",
            "experts": variant.experts,
            "boundary_ratio": variant.boundary_ratio,
            "flow_shift": variant.flow_shift,
            "defaults": dict(self.defaults),
            "tasks": ["t2va", "fl2va"] if takes_image else ["t2va"],  # fl2va: the first frame (input_reference)
            "loras_enabled": False,
        }
        if takes_image:
            self.metadata["image_condition"] = f"'{FIRST_FRAME}': the first frame, stretched onto the canvas"

    def plan(self, job_request: JobRequest) -> VideoShape:
        """ValueError (a 422 at submission) for a canvas off the variant's grid, or what only MiniMax H3 takes."""
        self._check_media(job_request)
        if job_request.preset is not None or job_request.loras:
            raise ValueError("Wan 2.2 has no presets or LoRAs here")
        if not job_request.seconds > 0:
            raise ValueError(f"seconds must be positive, got {job_request.seconds}")
        width, height = canvas(job_request.resolution, job_request.aspect_ratio, self.size_multiple)
        fps = self._pipe.release.fps
        frames = frame_count(job_request.seconds, fps)
        self._pipe.latent_shape(width, height, frames)  # the pipeline's own size rules
        return VideoShape(width, height, frames, fps, frames / fps, job_request.steps, task=job_request.task)

    def _check_media(self, job_request: JobRequest) -> None:
        """TI2V-5B takes one first frame; a last frame or references (MiniMax H3's) are refused, naming the field."""
        variant = self._pipe.release
        for media in job_request.media:
            if media.role == "first_frame" and variant.takes_image:
                continue
            takes = (
                f"one image, the first frame ('{FIRST_FRAME}')"
                if variant.takes_image
                else "text only (the image condition is TI2V-5B's)"
            )
            raise ValueError(
                f"'{FIELD_OF_ROLE.get(media.role, media.role)}': Wan 2.2 {variant.name.upper()} takes {takes}"
            )

    def memory_estimate(self, plan: VideoShape) -> dict[str, int]:
        """Bytes one job needs on this rank beyond what stays resident: what it holds throughout and its largest
        stage (a lent expert included), from the model's workload under the service's placement."""
        from telefuser.memory.plan import MemoryPlan

        if self._memory is None or self._memory_plan is None:
            return {}
        request = {"size": f"{plan.width}x{plan.height}", "num_frames": plan.frames}
        job = MemoryPlan(self._memory(request), self._memory_plan.placement, None, "")
        stage = job.peak_stage
        return {**job.workload.held, f"stage {stage}": job.stage_bytes()[stage]}

    def run(self, job_request: JobRequest, output: Path | None, hooks: StepHooks) -> RunOutcome:
        from telefuser.profiling.timing import peak_memory, reset_peak_memory

        plan = self.plan(job_request)  # a request the model cannot make fails with the plan's message, before any work
        image = self._first_frame(job_request)
        device = self._pipe.device
        with self._lock:
            reset_peak_memory(device)
            started = time.perf_counter()
            try:
                video = self._pipe(
                    job_request.prompt,
                    negative_prompt=job_request.negative_prompt or "",
                    width=plan.width,
                    height=plan.height,
                    num_frames=plan.frames,
                    steps=job_request.steps,
                    guidance_scale=job_request.guidance_scale,  # None: the release's, per expert
                    guidance_scale_2=self._second_scale(job_request),
                    seed=job_request.seed,
                    image=image,
                    hooks=hooks,
                )
            except GenerationCancelled as exc:
                raise JobCancelled(exc.steps_done) from None
            pipeline_s = time.perf_counter() - started
            peak_bytes, peak_kind = peak_memory(device)
        mux_s = 0.0
        if output is not None:
            report_stage(hooks, "muxing")
            mux_s = write_clip(output, video.frames, video.fps, None, None, job_request.output_dims)
        width, height = job_request.output_dims or (plan.width, plan.height)
        return RunOutcome(
            inference_time_s=pipeline_s,
            peak_memory_bytes=int(peak_bytes),
            peak_memory_kind=peak_kind,
            frames=int(video.frames.shape[0]),
            fps=int(video.fps),
            width=width,
            height=height,
            duration_s=plan.duration_s,
            dit_calls=int(video.dit_calls),
            mux_s=mux_s,
            generated_size=plan.generated_size if job_request.output_dims else None,
            timings={**video.timings, "pipeline_s": pipeline_s},
            metrics=self._metrics(job_request, video.dit_calls),
        )

    def _first_frame(self, job_request: JobRequest):
        """The job's first frame as an RGB PIL image (EXIF-rotated), or None; ValueError (the job fails) when the bytes
        read back do not decode (they passed the checks at submission)."""
        media = next((m for m in job_request.media if m.role == "first_frame"), None)
        if media is None:
            return None
        if media.data is None:
            raise ValueError(f"'{FIRST_FRAME}': the job's media were not loaded")
        try:
            return open_image(media.data, f"'{FIRST_FRAME}'", self.media_limits)
        except RequestError as exc:
            raise ValueError(exc.detail) from None

    def close(self) -> None:
        for expert in self._pipe.experts:
            close = getattr(expert, "close", None)
            if callable(close):
                close()  # the Ulysses communicator, where one was opened

    @staticmethod
    def _second_scale(job_request: JobRequest) -> float | None:
        """The low-noise expert's guidance: guidance_scale_2, else guidance_scale (as diffusers' WanPipeline), else
        None (the release's)."""
        return job_request.guidance_scale_2 if job_request.guidance_scale_2 is not None else job_request.guidance_scale

    def _metrics(self, job_request: JobRequest, dit_calls: int) -> dict[str, Any]:
        release = self._pipe.release
        first, second = job_request.guidance_scale, self._second_scale(job_request)
        guidance = [release.guidance[0] if first is None else first, release.guidance[1] if second is None else second]
        return {
            "variant": release.name,
            "dit_calls": dit_calls,
            "guidance_scale": guidance,  # as each expert (high noise, low noise) ran
            "classifier_free_guidance": guidance[0] > 1.0,
            "negative_prompt": bool(job_request.negative_prompt),
            "image": any(m.role == "first_frame" for m in job_request.media),
        }


def build_wan22_runner(args: argparse.Namespace) -> Wan22Runner:
    """`telefuser serve --model wan2.2-t2v-a14b | wan2.2-ti2v-5b`: the pipeline on this rank (Ulysses over the
    torchrun world)."""
    import functools

    from telefuser.memory.plan import plan_or_exit
    from telefuser.models.registry import get_spec
    from telefuser.models.wan2_2.config import release
    from telefuser.runtime import Runtime

    spec = get_spec(args.model)
    _refuse_minimax_options(args, spec.name)
    runtime = Runtime.from_args(args)
    attn_impl = spec.attention_impl(args, runtime)  # auto resolved on this rank's device, agreed by all ranks
    # the plan is made for the default job, before any weight loads; every job is checked against the memory left
    planned = release(spec.name.removeprefix("wan2.2-"), "official" if args.checkpoint else args.config)
    size = args.size_default or f"{planned.size[0]}x{planned.size[1]}"
    seconds = args.seconds_default or planned.frames / planned.fps
    request = {"size": size, "num_frames": frame_count(seconds, planned.fps)}
    memory_plan = plan_or_exit(spec, args, runtime, request)
    try:
        pipe = spec.build_pipeline(args, runtime, attn_impl=attn_impl, placement=memory_plan.placement)
    except ValueError as exc:  # heads that --ulysses-degree does not divide, a config the variant cannot take
        raise StartupError(f"{spec.name}: {exc}") from None
    variant = pipe.release
    defaults = {
        "size": args.size_default or f"{variant.size[0]}x{variant.size[1]}",
        "seconds": args.seconds_default or variant.frames / variant.fps,
        "steps": args.steps_default or variant.steps,
        "seed": 0,
    }
    info = {
        "config": "checkpoint" if args.checkpoint else args.config,
        "checkpoint": str(args.checkpoint) if args.checkpoint else None,
        "device": str(runtime.device),
        "dtype": runtime.dtype_name,
        "attn_impl": attn_impl,
        "attn_impl_requested": spec.option(args, "attn_impl"),
        "quantization": spec.option(args, "quantization"),
        "vae_dtype": spec.option(args, "vae_dtype"),
        "world_size": runtime.world_size,
        "ulysses_degree": runtime.parallel.ulysses_degree,
        "tp_degree": runtime.parallel.tp_degree,
        "offload": memory_plan.placement.tier,
        "memory_plan": memory_plan.summary(),
    }
    if warmup_wanted(args, runtime.device):  # every rank: the DiT is collective
        info["warmup_s"] = round(_warm_up(pipe, defaults), 3)
    return Wan22Runner(
        pipe,
        model=args.served_model_name,
        defaults=defaults,
        info=info,
        memory_plan=memory_plan,
        memory=functools.partial(spec.memory_workload, args, runtime.parallel, runtime.dtype),
        media_limits=MediaLimits(
            max_image_pixels=getattr(args, "max_image_pixels", None) or MediaLimits.max_image_pixels
        ),
    )


def _refuse_minimax_options(args: argparse.Namespace, name: str) -> None:
    """The service flags only MiniMax H3 takes end the command before any weight loads."""
    if getattr(args, "lora_dir", None) is not None:
        raise StartupError(f"--lora-dir: {name} takes no LoRAs here (MiniMax H3 does)")
    if getattr(args, "task_partition", "FL2VA") != "FL2VA":
        raise StartupError(f"--task-partition is MiniMax H3's; {name} has one DiT for every request")
    if getattr(args, "tp_degree", 1) != 1:
        raise StartupError(f"{name} runs Ulysses only: leave --tp-degree at 1 and set --ulysses-degree")


def _warm_up(pipe, defaults: dict[str, Any]) -> float:
    """One discarded request of one step at the default canvas and length (its kernels, the decode); seconds."""
    started = time.perf_counter()
    width, height = parse_size(defaults["size"], what="the default size", example="1280x720")
    pipe("warm-up", width=width, height=height, num_frames=frame_count(defaults["seconds"], pipe.release.fps), steps=1)
    seconds = time.perf_counter() - started
    log.info("warm-up request (%s, one DiT call) took %.1f s", defaults["size"], seconds)
    return seconds
