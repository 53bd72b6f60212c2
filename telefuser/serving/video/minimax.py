"""The video service's real model: MiniMax H3 text (+ keyframes or references) -> video + audio behind the
`VideoRunner` interface.

A server runs one DiT partition (`--task-partition`): FL2VA (t2va and fl2va jobs) or Ref2VA (ref2va jobs). Before each
job the runner makes the job's LoRA set the merged one (lora_library.py: nothing is merged again when it already is)
and decodes the job's media (minimax_inputs.py); a preset gives the job its flow shifts. Progress and cancellation
are the pipeline's own (`StepHooks`, passed through), so a cancelled job stops between two denoising steps. Under
torchrun every rank builds the same runner on its share of the mesh; rank 0 serves and replays each job on the others
(replay.py), which switch LoRAs as rank 0 does. `memory_estimate`'s terms and calibration are in serving/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import threading
from pathlib import Path
from typing import Any

from telefuser.memory.plan import plan_or_exit
from telefuser.pipelines.hooks import GenerationCancelled, StepHooks

from ..common.startup import StartupError
from ..common.warmup import warmup_wanted
from .canvas import write_clip
from .contract import JobCancelled, RunOutcome, VideoShape, JobRequest, report_stage
from .lora_library import LoraLibrary, LoraSwitch
from .media import MediaLimits
from .minimax_inputs import pipeline_inputs

log = logging.getLogger(__name__)
NATIVE_SIZE = "1344x768"  # the official canvas policy's 16:9 size (short edge 768, area cap)


def _tiny_references():
    from telefuser.pipelines.minimax_h3.conditions import ReferencePolicy

    return ReferencePolicy(canvas_short_edge=32, canvas_max_pixels=32 * 64, image_short_edge=64)


def preset_metadata() -> dict[str, dict[str, Any]]:
    """MiniMax H3's sampling presets as the service shows and applies them."""
    from telefuser.pipelines.minimax_h3.presets import PRESETS

    return {
        name: {"steps": p.steps, "dit_calls": p.dit_calls, "video_shift": p.video_shift, "audio_shift": p.audio_shift}
        for name, p in PRESETS.items()
    }


class MiniMaxRunner:
    def __init__(
        self,
        pipeline,
        *,
        model: str = "MiniMax-H3",
        defaults: dict[str, Any],
        info: dict[str, Any] | None = None,
        feature_cache: str | None = None,
        memory_plan=None,
        memory=None,
        loras: LoraLibrary | None = None,
        media_limits: MediaLimits | None = None,
    ):
        """`memory_plan`: the service's `memory.plan.MemoryPlan` (its placement); `memory(request)`: the model's
        workload of one request, for each job's estimate. `loras`: the --lora-dir files (None: no LoRAs); with them
        the pipeline must have been built with `lora_switching=True`. `media_limits`: the bounds uploads are decoded
        within."""
        from telefuser.pipelines.minimax_h3.pipeline import PARTITION_TASKS
        from telefuser.pipelines.minimax_h3.shapes import AUDIO_SAMPLE_RATE, FPS, VAE_SPATIAL

        self._pipe = pipeline
        self.loras = loras
        self._lora_switch = LoraSwitch(pipeline.dit, loras) if loras is not None else None
        self.media_limits = media_limits or MediaLimits()
        self._memory_plan, self._memory = memory_plan, memory
        info = dict(info or {})
        self._lock = threading.Lock()  # one job at a time: a pipeline call is not reentrant
        self.model = model
        self.feature_cache = feature_cache
        self.defaults = dict(defaults)
        self.metadata = {
            "model": model,
            "runner": "MiniMax H3 text (+ keyframes or references) to video+audio",
            "weights": pipeline.weights.get("summary", ""),
            "native_size": NATIVE_SIZE,
            **info,
            "feature_cache": feature_cache or "none",
            "fps": FPS,
            "audio": True,
            "sample_rate": AUDIO_SAMPLE_RATE,
            "audio_channels": 2,
            "size_multiple": VAE_SPATIAL * max(pipeline.patch_size[1:]),
            "frame_grid": "17n+5 frames at 24 fps (requested seconds are snapped up)",
            "steps": "num_inference_steps = N sigma points -> N-1 DiT calls",
            "guidance": False,
            "defaults": dict(self.defaults),
            "partition": pipeline.partition,
            "tasks": list(PARTITION_TASKS[pipeline.partition]),
            "presets": preset_metadata(),
            "loras_enabled": loras is not None,
        }

    @property
    def lora_switches(self) -> int:
        """LoRA merges and unmerges so far (a job whose set is merged already makes none)."""
        return self._lora_switch.switches if self._lora_switch is not None else 0

    def plan(self, job_request: JobRequest) -> VideoShape:
        """ValueError (a 422 at submission) for a task this partition does not run, an unknown preset, or a LoRA
        that is not in --lora-dir or does not fit this DiT."""
        from telefuser.pipelines.minimax_h3 import FlowSchedule
        from telefuser.pipelines.minimax_h3.shapes import FPS

        if job_request.task not in self.metadata["tasks"]:
            raise ValueError(
                f"this server runs the {self._pipe.partition} DiT, which does not run {job_request.task} jobs"
            )
        if job_request.preset is not None and job_request.preset not in self.metadata["presets"]:
            raise ValueError(f"unknown preset {job_request.preset!r}")
        if job_request.loras:
            if self.loras is None:
                raise ValueError("this server takes no LoRAs: it was started without --lora-dir")
            self.loras.check([name for name, _ in job_request.loras], self._pipe.dit)
        shape = self._pipe.plan(
            duration=job_request.seconds, resolution=job_request.resolution, aspect_ratio=job_request.aspect_ratio
        )
        schedule = FlowSchedule.build(job_request.steps)  # the shifts do not change the count
        conditions = tuple(
            ("keyframe" if m.role != "reference" else m.kind, m.width, m.height) for m in job_request.media
        )  # fmt: skip
        return VideoShape(
            shape.width,
            shape.height,
            shape.frame_count,
            FPS,
            shape.duration_s,
            schedule.num_dit_calls,
            task=job_request.task,
            conditions=conditions,
        )

    def memory_estimate(self, plan: VideoShape) -> dict[str, int]:
        """Bytes one job needs on this rank beyond what stays resident: what it holds throughout and its largest
        stage, from the model's memory workload under the service's placement (serving/README.md)."""
        from telefuser.memory.plan import MemoryPlan

        request = {
            "duration": plan.duration_s,
            "resolution": f"{plan.width}x{plan.height}",
            "steps": plan.dit_calls + 1,
            "keyframes": sum(1 for kind, _, _ in plan.conditions if kind == "keyframe"),
            "references": [(kind, (w, h) if w and h else None) for kind, w, h in plan.conditions if kind != "keyframe"],
        }
        job = MemoryPlan(self._memory(request), self._memory_plan.placement, None, "")
        stage = job.peak_stage
        return {**job.workload.held, f"stage {stage}": job.stage_bytes()[stage]}

    def run(self, job_request: JobRequest, output: Path | None, hooks: StepHooks) -> RunOutcome:
        plan = self.plan(job_request)  # a request the model cannot make fails with the plan's message, before any work
        inputs = pipeline_inputs(job_request, plan.duration_s, self.media_limits)
        shifts = {}
        if job_request.preset is not None:
            preset = self.metadata["presets"][job_request.preset]
            shifts = {"flow_shift": preset["video_shift"], "audio_flow_shift": preset["audio_shift"]}
        with self._lock:
            switched = self._switch_loras(job_request)
            try:
                result = self._pipe(
                    job_request.prompt,
                    duration=job_request.seconds,
                    resolution=job_request.resolution,
                    aspect_ratio=job_request.aspect_ratio,
                    steps=job_request.steps,
                    seed=job_request.seed,
                    feature_cache=self.feature_cache,
                    hooks=hooks,
                    **shifts,
                    **inputs,
                )
            except GenerationCancelled as exc:
                raise JobCancelled(exc.steps_done) from None
            applied = self._lora_switch.applied if self._lora_switch is not None else []
        mux_s = 0.0
        if output is not None:
            report_stage(hooks, "muxing")
            mux_s = write_clip(
                output,
                result.frames.numpy(),
                result.fps,
                result.audio.numpy(),
                result.sample_rate,
                job_request.output_dims,
            )
        metrics = result.metrics()
        metrics["preset"] = job_request.preset
        metrics["loras"] = {"applied": applied, "switched": switched, "switches": self.lora_switches}
        width, height = job_request.output_dims or (result.shape.width, result.shape.height)
        return RunOutcome(
            inference_time_s=result.timings.pipeline_s,
            peak_memory_bytes=int(result.peak_memory_bytes),
            peak_memory_kind=result.peak_memory_kind,
            frames=int(result.frames.shape[0]),
            fps=int(result.fps),
            width=width,
            height=height,
            duration_s=result.shape.duration_s,
            generated_size=f"{result.shape.width}x{result.shape.height}" if job_request.output_dims else None,
            audio_channels=int(result.audio.shape[0]),
            audio_samples=int(result.audio.shape[-1]),
            sample_rate=int(result.sample_rate),
            dit_calls=int(result.dit_calls_computed),
            dit_calls_skipped=int(result.dit_calls_skipped),
            mux_s=mux_s,
            timings=result.timings.as_dict(),
            metrics=metrics,
        )

    def close(self) -> None:
        self._pipe.close()

    def _switch_loras(self, job_request: JobRequest) -> bool:
        """The job's LoRA set merged (none: unmerged); True when the weights changed for this job. A server without
        --lora-dir has none to switch (`plan` refused any)."""
        return self._lora_switch.ensure(job_request.loras) if self._lora_switch is not None else False


def build_minimax_runner(args: argparse.Namespace) -> MiniMaxRunner:
    """`telefuser serve --model minimax_h3`: the pipeline on this rank (Ulysses x TP over the torchrun world)."""
    from telefuser.models.minimax_h3.spec import MINIMAX_H3
    from telefuser.runtime import Runtime

    runtime = Runtime.from_args(args)
    attn_impl = MINIMAX_H3.attention_impl(args, runtime)  # auto resolved on this rank's device, agreed by all ranks
    device, dtype_name, world, parallel = runtime.device, runtime.dtype_name, runtime.world_size, runtime.parallel
    tiny = args.checkpoint is None and args.config == "tiny"
    defaults = {
        "size": args.size_default or ("64x32" if tiny else "1344x768"),
        "seconds": args.seconds_default or (0.5 if tiny else 5.0),
        "steps": args.steps_default or 50,
        "seed": 0,
    }
    # the plan is made for the default job; every job is checked against the memory left (limits.py)
    request = {"duration": defaults["seconds"], "resolution": defaults["size"], "steps": defaults["steps"]}
    memory_plan = plan_or_exit(MINIMAX_H3, args, runtime, request)
    partition = getattr(args, "task_partition", None) or "FL2VA"
    lora_dir = getattr(args, "lora_dir", None)
    try:
        loras = LoraLibrary(lora_dir, partition) if lora_dir is not None else None  # before any weight loads
        pipe = MINIMAX_H3.build_pipeline(
            args,
            runtime,
            attn_impl=attn_impl,
            placement=memory_plan.placement,
            show_progress=False,
            partition=partition,
            lora_switching=loras is not None,  # host copies of what a merge changes, to unmerge exactly
        )
    except ValueError as exc:  # --lora-dir that is not a directory, or with streamed blocks (--offload block)
        raise StartupError(str(exc)) from None
    if tiny:  # references at the tiny canvas's scale, not the release's 2048-pixel short edge (minutes on a CPU)
        pipe.reference_policy = _tiny_references()
    info = {
        "config": "checkpoint" if args.checkpoint else args.config,
        "checkpoint": str(args.checkpoint) if args.checkpoint else None,
        "device": str(device),
        "dtype": dtype_name,
        "attn_impl": attn_impl,
        "attn_impl_requested": MINIMAX_H3.option(args, "attn_impl"),  # "auto", or the name given
        "quantization": MINIMAX_H3.option(args, "quantization"),
        "world_size": world,
        "ulysses_degree": parallel.ulysses_degree,
        "tp_degree": parallel.tp_degree,
        "offload": memory_plan.placement.tier,
        "memory_plan": memory_plan.summary(),
        "reference_policy": dataclasses.asdict(pipe.reference_policy),
    }
    if warmup_wanted(args, device):  # every rank: the DiT is collective
        seconds = pipe.warm_up(duration=defaults["seconds"], resolution=defaults["size"])
        info["warmup_s"] = round(seconds, 3)
        log.info("warm-up request (%s, %g s, one DiT call) took %.1f s", defaults["size"], defaults["seconds"], seconds)
    return MiniMaxRunner(
        pipe,
        model=args.served_model_name,
        defaults=defaults,
        info=info,
        feature_cache="ada_taylor" if args.enable_feature_cache else None,
        memory_plan=memory_plan,
        memory=functools.partial(MINIMAX_H3.memory_workload, args, parallel, runtime.dtype),
        loras=loras,
        media_limits=MediaLimits(
            max_image_pixels=getattr(args, "max_image_pixels", None) or MediaLimits.max_image_pixels
        ),
    )
