"""The video service's real model: MiniMax H3 text -> video + audio behind the `VideoRunner` interface.

Progress and cancellation are the pipeline's own (`StepHooks`, passed through), so a cancelled job stops between two
denoising steps. Under torchrun every rank builds the same runner on its share of the mesh; rank 0 serves and
replays each job on the others (replay.py). `memory_estimate`'s terms and calibration are in serving/README.md.
"""

from __future__ import annotations

import argparse
import functools
import logging
import threading
from pathlib import Path
from typing import Any

from telefuser.memory.plan import plan_or_exit
from telefuser.pipelines.hooks import GenerationCancelled, StepHooks

from ..common.warmup import warmup_wanted
from .canvas import write_clip
from .contract import JobCancelled, RunOutcome, VideoPlan, VideoSpec

log = logging.getLogger(__name__)
NATIVE_SIZE = "1344x768"  # the official canvas policy's 16:9 size (short edge 768, area cap)


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
    ):
        """`memory_plan`: the service's `memory.plan.MemoryPlan` (its placement); `memory(request)`: the model's
        workload of one request, for each job's estimate."""
        from telefuser.pipelines.minimax_h3.shapes import AUDIO_SAMPLE_RATE, FPS, VAE_SPATIAL

        self._pipe = pipeline
        self._memory_plan, self._memory = memory_plan, memory
        info = dict(info or {})
        self._lock = threading.Lock()  # one job at a time: a pipeline call is not reentrant
        self.model = model
        self.feature_cache = feature_cache
        self.defaults = dict(defaults)
        self.metadata = {
            "model": model,
            "runner": "MiniMax H3 text-to-video+audio",
            "weights": pipeline.weights.get("summary", ""),
            "native_size": NATIVE_SIZE,
            **info,
            "feature_cache": feature_cache or "none",
            "fps": FPS,
            "sample_rate": AUDIO_SAMPLE_RATE,
            "audio_channels": 2,
            "size_multiple": VAE_SPATIAL * max(pipeline.patch_size[1:]),
            "frame_grid": "17n+5 frames at 24 fps (requested seconds are snapped up)",
            "steps": "num_inference_steps = N sigma points -> N-1 DiT calls",
            "guidance": False,
            "defaults": dict(self.defaults),
        }

    def plan(self, spec: VideoSpec) -> VideoPlan:
        from telefuser.pipelines.minimax_h3 import FlowSchedule
        from telefuser.pipelines.minimax_h3.shapes import FPS

        shape = self._pipe.plan(duration=spec.seconds, resolution=spec.resolution, aspect_ratio=spec.aspect_ratio)
        schedule = FlowSchedule.build(spec.steps)  # the pipeline's default flow shifts
        return VideoPlan(shape.width, shape.height, shape.frame_count, FPS, shape.duration_s, schedule.num_dit_calls)

    def memory_estimate(self, plan: VideoPlan) -> dict[str, int]:
        """Bytes one job needs on this rank beyond what stays resident: what it holds throughout and its largest
        stage, from the model's memory workload under the service's placement (serving/README.md)."""
        from telefuser.memory.plan import MemoryPlan

        request = {
            "duration": plan.duration_s,
            "resolution": f"{plan.width}x{plan.height}",
            "steps": plan.dit_calls + 1,
        }
        job = MemoryPlan(self._memory(request), self._memory_plan.placement, None, "")
        stage = job.peak_stage
        return {**job.workload.held, f"stage {stage}": job.stage_bytes()[stage]}

    def run(self, spec: VideoSpec, output: Path | None, hooks: StepHooks) -> RunOutcome:
        self.plan(spec)  # a spec the model cannot make fails with the plan's message, before any work
        with self._lock:
            try:
                result = self._pipe(
                    spec.prompt,
                    duration=spec.seconds,
                    resolution=spec.resolution,
                    aspect_ratio=spec.aspect_ratio,
                    steps=spec.steps,
                    seed=spec.seed,
                    feature_cache=self.feature_cache,
                    hooks=hooks,
                )
            except GenerationCancelled as exc:
                raise JobCancelled(exc.steps_done) from None
        mux_s = 0.0
        if output is not None:
            mux_s = write_clip(
                output, result.frames.numpy(), result.fps, result.audio.numpy(), result.sample_rate, spec.output_dims
            )
        metrics = result.metrics()
        width, height = spec.output_dims or (result.shape.width, result.shape.height)
        return RunOutcome(
            inference_time_s=result.timings.pipeline_s,
            peak_memory_bytes=int(result.peak_memory_bytes),
            peak_memory_kind=result.peak_memory_kind,
            frames=int(result.frames.shape[0]),
            fps=int(result.fps),
            width=width,
            height=height,
            duration_s=result.shape.duration_s,
            generated_size=f"{result.shape.width}x{result.shape.height}" if spec.output_dims else None,
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
    pipe = MINIMAX_H3.build_pipeline(
        args, runtime, attn_impl=attn_impl, placement=memory_plan.placement, show_progress=False
    )
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
    )
