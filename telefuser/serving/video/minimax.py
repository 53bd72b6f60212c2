"""The video service's real model: MiniMax H3 text -> video + audio behind the `VideoRunner` interface.

Progress and cancellation are the pipeline's own (`StepHooks`, passed through), so a cancelled job stops between two
denoising steps. Under torchrun every rank builds the same runner on its share of the mesh; rank 0 serves and
replays each job on the others (replay.py). `memory_estimate`'s terms and calibration are in serving/README.md.
"""

from __future__ import annotations

import argparse
import logging
import threading
from pathlib import Path
from typing import Any

import torch

from telefuser.pipelines.hooks import GenerationCancelled, StepHooks
from telefuser.runtime import torch_dtype

from ..common.warmup import warmup_wanted
from .canvas import write_clip
from .contract import JobCancelled, RunOutcome, VideoPlan, VideoSpec

log = logging.getLogger(__name__)
NATIVE_SIZE = "1344x768"  # the official canvas policy's 16:9 size (short edge 768, area cap)
TEXT_TOKENS = 1024  # a generous prompt; the joint sequence holds the text tokens too
LATENT_COPIES = 6
DECODE_FEATURE_MAPS, DECODE_CHANNELS = 8, 128


class MiniMaxRunner:
    def __init__(
        self,
        pipeline,
        *,
        model: str = "MiniMax-H3",
        defaults: dict[str, Any],
        info: dict[str, Any] | None = None,
        feature_cache: str | None = None,
        lent_bytes: int = 0,
    ):
        from telefuser.pipelines.minimax_h3.shapes import AUDIO_SAMPLE_RATE, FPS, VAE_SPATIAL

        self._pipe = pipeline
        self._lent_bytes = int(lent_bytes)
        info = dict(info or {})
        self._dtype_bytes = torch.empty((), dtype=torch_dtype(info.get("dtype", "float32"))).element_size()
        self._ulysses, self._tp = int(info.get("ulysses_degree", 1)), int(info.get("tp_degree", 1))
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
        """Bytes one job needs on this rank beyond the resident weights (serving/README.md)."""
        shape = self._pipe.plan(duration=plan.duration_s, resolution=f"{plan.width}x{plan.height}")
        config = self._pipe.dit.config
        hidden, ffn = int(config.hidden_size), int(config.ffn_hidden_size)
        pt, ph, pw = self._pipe.patch_size
        video_tokens = (shape.video_latent_t // pt) * (shape.latent_h // ph) * (shape.latent_w // pw)
        tokens = video_tokens + shape.audio_tokens + TEXT_TOKENS
        latents = int(torch.Size(shape.video_latent_shape).numel()) + int(torch.Size(shape.audio_latent_shape).numel())
        pixels = plan.frames * plan.width * plan.height
        return {
            "activations": -(-tokens // self._ulysses) * (12 * hidden + 4 * ffn // self._tp) * self._dtype_bytes,
            "latents": LATENT_COPIES * latents * 4,
            "decode": pixels * 3 * (2 * 4 + 1) + DECODE_FEATURE_MAPS * plan.width * plan.height * DECODE_CHANNELS * 4,
            "text_encoder": self._lent_bytes,
            "adaln_tables": self._adaln_bytes(plan.dit_calls),
        }

    def _adaln_bytes(self, dit_calls: int) -> int:
        """The request's AdaLN tables (gathered: full on every TP rank), plus one projection's slice lent to the
        device while they are computed when the projections are offloaded; 0 for a DiT without tables."""
        dit = self._pipe.dit
        if not getattr(self._pipe, "adaln_tables", False) or not callable(getattr(dit, "precompute_adaln", None)):
            return 0
        from telefuser.models.minimax_h3 import adaln_table_bytes

        tables = adaln_table_bytes(dit.config, dit_calls, dtype_bytes=self._dtype_bytes)
        lent = 0
        if getattr(dit, "adaln_offloaded", False):
            lent = max(_module_bytes(p) for p in dit.adaln_projections())
        return tables + lent

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
    pipe = MINIMAX_H3.build_pipeline(args, runtime, attn_impl=attn_impl, show_progress=False)
    tiny = args.checkpoint is None and args.config == "tiny"
    defaults = {
        "size": args.size_default or ("64x32" if tiny else "1344x768"),
        "seconds": args.seconds_default or (0.5 if tiny else 5.0),
        "steps": args.steps_default or 50,
        "seed": 0,
    }
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
        "offload_adaln": MINIMAX_H3.option(args, "offload_adaln"),
    }
    if warmup_wanted(args, device):  # every rank: the DiT is collective
        seconds = pipe.warm_up(duration=defaults["seconds"], resolution=defaults["size"])
        info["warmup_s"] = round(seconds, 3)
        log.info("warm-up request (%s, %g s, one DiT call) took %.1f s", defaults["size"], defaults["seconds"], seconds)
    lent = _module_bytes(getattr(pipe.prompt_encoder, "encoder", None)) if args.offload_text_encoder else 0
    return MiniMaxRunner(
        pipe,
        model=args.served_model_name,
        defaults=defaults,
        info=info,
        lent_bytes=lent,
        feature_cache="ada_taylor" if args.enable_feature_cache else None,
    )


def _module_bytes(module) -> int:
    """Bytes of a module's parameters and buffers (0 for anything that is not a module)."""
    if not isinstance(module, torch.nn.Module):
        return 0
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
