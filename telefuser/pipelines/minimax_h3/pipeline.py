"""MiniMax H3 text (+ keyframes or references) -> video + audio: encode the prompt, denoise both latents with one
DiT, decode.

T2VA and FL2VA (first / last keyframes) run the FL2VA DiT, Ref2VA (image, video, audio references) the Ref2VA one: a
pipeline holds one of them (`partition`). The conditions are prepared in `conditions.py`. The DiT is injected (its
contract is in this folder's README); noise follows diffusers' MiniMax H3 pipeline, so a run is comparable with it
seed for seed. Progress and cancellation are the call's own (`hooks`: pipelines/hooks.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from PIL import Image
from tqdm.auto import tqdm

from telefuser.feature_cache import AdaTaylorCache, AdaTaylorCacheCalibrator, AdaTaylorParams, params_path
from telefuser.profiling.timing import MemoryPeaks, Stopwatch, peak_memory, reset_peak_memory, synchronize

from ..hooks import NO_HOOKS, GenerationCancelled, StepHooks
from ..request_boundary import reset_parallel
from .conditions import (
    ConditionRequest,
    ImageReference,
    ReferencePolicy,
    encode_conditions,
    pack_conditions,
    resolve_canvas,
)
from .scheduler import DEFAULT_AUDIO_FLOW_SHIFT, DEFAULT_NUM_STEPS, DEFAULT_VIDEO_FLOW_SHIFT, FlowSchedule
from .shapes import (
    AUDIO_LATENT_CHANNELS,
    AUDIO_SAMPLE_RATE,
    FPS,
    MIN_FRAMES,
    OFFICIAL_SHORT_EDGE,
    VIDEO_LATENT_CHANNELS,
    MiniMaxH3Shape,
    align_frame_count,
    plan_shape,
)

log = logging.getLogger(__name__)

DEFAULT_TIMESTEP_SCALE = 1000.0
CHECKPOINT_PREFIX = "checkpoint"  # how a loaded DiT's weights_source starts (checkpoint_io.finish_loading)
# The release's two DiT partitions and the tasks each runs (diffusers: `transformer` and `transformer_ref`).
PARTITION_TASKS = {"FL2VA": ("t2va", "fl2va"), "Ref2VA": ("ref2va",)}


def partition_for_task(task: str) -> str:
    """The DiT partition a task runs on: "FL2VA" for "t2va" and "fl2va", "Ref2VA" for "ref2va"."""
    for partition, tasks in PARTITION_TASKS.items():
        if task in tasks:
            return partition
    raise ValueError(f"task must be one of t2va, fl2va, ref2va, got {task!r}")


@dataclass
class MiniMaxH3Timings:
    pipeline_s: float = 0.0
    text_encode_s: float = 0.0
    condition_encode_s: float = 0.0  # FL2VA / Ref2VA: media normalization and VAE encodes
    adaln_tables_s: float = 0.0
    dit_total_s: float = 0.0
    dit_step_s: list[float] = field(default_factory=list)
    video_decode_s: float = 0.0
    audio_decode_s: float = 0.0

    @property
    def vae_decode_s(self) -> float:
        return self.video_decode_s + self.audio_decode_s

    def as_dict(self) -> dict:
        return {
            "pipeline_s": self.pipeline_s,
            "text_encode_s": self.text_encode_s,
            "condition_encode_s": self.condition_encode_s,
            "adaln_tables_s": self.adaln_tables_s,
            "dit_total_s": self.dit_total_s,
            "dit_step_s": list(self.dit_step_s),
            "vae_decode_s": self.vae_decode_s,
            "video_decode_s": self.video_decode_s,
            "audio_decode_s": self.audio_decode_s,
        }


@dataclass
class MiniMaxH3Result:
    frames: torch.Tensor  # uint8 [F, H, W, 3], CPU
    audio: torch.Tensor  # float32 [2, samples] in [-1, 1], CPU
    shape: MiniMaxH3Shape
    timings: MiniMaxH3Timings
    peak_memory_bytes: int
    peak_memory_kind: str
    dit_calls_computed: int
    dit_calls_skipped: int
    weights: dict[str, str]
    request: dict
    video_latents: torch.Tensor  # fp32 [1, 24, T, h, w], CPU: for parity checks against a reference run
    audio_latents: torch.Tensor  # fp32 [1, 32, 2 * Ta], CPU
    fps: int = FPS
    sample_rate: int = AUDIO_SAMPLE_RATE
    feature_cache: object | None = None  # the hook that ran (e.g. a calibrator to save), not part of metrics()
    stage_peak_bytes: dict | None = None  # on CUDA: {"allocated"|"reserved": {stage: bytes}} (text, tables, ...)

    def metrics(self) -> dict:
        """Everything worth recording about the run, JSON-serializable."""
        return {
            "request": dict(self.request),
            "shape": self.shape.as_dict(),
            "fps": self.fps,
            "sample_rate": self.sample_rate,
            "frames": int(self.frames.shape[0]),
            "audio_samples": int(self.audio.shape[-1]),
            "timings": self.timings.as_dict(),
            "peak_memory": {
                "bytes": self.peak_memory_bytes,
                "gib": self.peak_memory_bytes / 2**30,
                "kind": self.peak_memory_kind,
                "stages": self.stage_peak_bytes or {},
            },
            "dit_calls": {"computed": self.dit_calls_computed, "skipped": self.dit_calls_skipped},
            "weights": dict(self.weights),
        }


class MiniMaxH3Pipeline:
    """One request per call: T2VA or FL2VA with the FL2VA DiT, Ref2VA with the Ref2VA DiT (`partition`). Holds its
    components; `close()` releases the DiT's parallel state."""

    def __init__(
        self,
        dit,
        prompt_encoder,
        video_decoder,
        audio_decoder,
        *,
        device: str | torch.device = "cpu",
        patch_size: tuple[int, int, int] = (1, 2, 2),
        timestep_scale: float = DEFAULT_TIMESTEP_SCALE,
        weights: dict[str, str] | None = None,
        show_progress: bool = True,
        adaln_tables: bool = False,
        partition: str = "FL2VA",
        reference_policy: ReferencePolicy | None = None,
    ) -> None:
        """`adaln_tables`: precompute each request's AdaLN tables (`MiniMaxH3DiT.precompute_adaln`, exact) when the
        DiT has the method; required when its projections are offloaded (`offload_adaln` turns it on). Off by
        default until the path has run on a GPU: the per-call projections are what was measured there.
        `partition`: which DiT `dit` is, "FL2VA" (T2VA and FL2VA requests) or "Ref2VA" (Ref2VA requests).
        `reference_policy`: the geometry Ref2VA references are normalized to (default: the release's)."""
        if partition not in PARTITION_TASKS:
            raise ValueError(f"partition must be one of {', '.join(PARTITION_TASKS)}, got {partition!r}")
        self.partition = partition
        self.reference_policy = reference_policy or ReferencePolicy()
        self.dit = dit
        self.adaln_tables = bool(adaln_tables)
        self.prompt_encoder = prompt_encoder
        self.video_decoder = video_decoder
        self.audio_decoder = audio_decoder
        self.device = torch.device(device)
        self.patch_size = tuple(int(p) for p in patch_size)
        self.timestep_scale = float(timestep_scale)
        self.show_progress = show_progress
        self.weights = (
            dict(weights)
            if weights
            else {
                "dit": "injected (caller did not say)",
                "text_encoder": "injected (caller did not say)",
                "tokenizer": getattr(getattr(prompt_encoder, "tokenizer", None), "description", "unknown"),
                "video_vae": getattr(video_decoder, "description", "unknown"),
                "audio_vae": getattr(audio_decoder, "description", "unknown"),
            }
        )

    def close(self) -> None:
        close = getattr(self.dit, "close", None)
        if callable(close):
            close()

    def warm_up(self, *, duration: float, resolution=OFFICIAL_SHORT_EDGE, aspect_ratio: str = "16:9") -> float:
        """Run and discard two requests of one DiT call each (steps=2): one at this shape, then one with a longer
        prompt and another frame count, so that the first real request pays for no kernel compilation or selection
        (the compiled elementwise chains, cuDNN's plans, the VAE's convolutions: seconds on CUDA). torch.compile
        specializes to the first shapes it sees and recompiles once, with dynamic sizes, at the second: both happen
        here, whatever the prompt's length or the clip's. Collective under Ulysses/TP: every rank calls it. Returns
        the seconds it took."""
        start = time.perf_counter()
        shape = self.plan(duration=duration, resolution=resolution, aspect_ratio=aspect_ratio)
        other_frames = MIN_FRAMES if shape.frame_count != MIN_FRAMES else align_frame_count(MIN_FRAMES + 1)
        common = dict(resolution=resolution, aspect_ratio=aspect_ratio, steps=2, seed=0)
        if self.partition == "Ref2VA":  # its DiT runs only with references: a grey image one
            common["references"] = (ImageReference(Image.new("RGB", (64, 64), (128, 128, 128))),)
        self("warm-up", duration=duration, **common)
        self(
            "a second warm-up request, whose prompt is longer than the first one's",
            duration=other_frames / FPS,
            **common,
        )
        return time.perf_counter() - start

    def plan(self, *, duration: float, resolution=OFFICIAL_SHORT_EDGE, aspect_ratio: str = "16:9") -> MiniMaxH3Shape:
        return plan_shape(
            duration_s=duration, resolution=resolution, aspect_ratio=aspect_ratio, patch_size=self.patch_size
        )

    @torch.no_grad()
    def __call__(
        self,
        prompt: str,
        *,
        duration: float = 5.0,
        resolution: int | str | tuple[int, int] = OFFICIAL_SHORT_EDGE,
        aspect_ratio: str | None = None,
        steps: int = DEFAULT_NUM_STEPS,
        seed: int = 0,
        flow_shift: float = DEFAULT_VIDEO_FLOW_SHIFT,
        audio_flow_shift: float = DEFAULT_AUDIO_FLOW_SHIFT,
        feature_cache=None,
        hooks: StepHooks = NO_HOOKS,
        first_frame=None,
        last_frame=None,
        references: Sequence = (),
    ) -> MiniMaxH3Result:
        """Generate one clip. `feature_cache`: None / "none", "ada_taylor" (bundled H3 parameters), or a hook
        object with ``set_step`` (an `AdaTaylorCache` with other parameters, an `AdaTaylorCacheCalibrator`).

        FL2VA: `first_frame` and/or `last_frame` (an RGB PIL image or a uint8 (H, W, 3) array); the canvas is the
        first keyframe's aspect ratio at the `resolution` short edge unless `aspect_ratio` names one (or
        `resolution` is WIDTHxHEIGHT). Ref2VA (a pipeline built with partition="Ref2VA"): `references`, an ordered
        sequence of `conditions.ImageReference` / `VideoReference` / `AudioReference` (at most 9 images, 3 videos,
        3 audio, 12 in all; audio never alone); `aspect_ratio` defaults to 16:9. Both are ValueErrors on the other
        partition, as are keyframes and references together.

        `hooks` (pipelines/hooks.py): ``progress(done, total)`` runs after each DiT call; ``cancelled()`` is asked
        before each, and a True answer raises `GenerationCancelled` (under Ulysses/TP every rank must give the same
        answers)."""
        _check_request(prompt, steps)
        conditioned = ConditionRequest.of(first_frame, last_frame, references)
        self._check_task(conditioned.task)
        canvas, canvas_ratio = resolve_canvas(conditioned, resolution, aspect_ratio, self._canvas_multiple)
        aspect_ratio = aspect_ratio or ("auto" if conditioned.task == "fl2va" else "16:9")  # as recorded
        shape = self.plan(duration=duration, resolution=canvas, aspect_ratio=canvas_ratio)
        schedule = FlowSchedule.build(steps, flow_shift, audio_flow_shift)
        cache = self._feature_cache(feature_cache, schedule.num_dit_calls)
        device, timings = self.device, MiniMaxH3Timings()
        reset_parallel(self.dit)  # a request boundary: reopen the copy engine if an earlier request failed on it

        reset_peak_memory(device)
        synchronize(device)
        started = time.perf_counter()
        stages = MemoryPeaks(device)  # the peaks the memory plan's stages are checked against
        with Stopwatch(device) as sw:
            text = self.prompt_encoder(prompt, device)
        timings.text_encode_s = sw.seconds
        stages.mark("text")
        conditions = None
        if conditioned.task == "t2va":
            video, audio = initial_noise(shape, seed, device)
        else:
            with Stopwatch(device) as sw:
                encoded = encode_conditions(
                    conditioned,
                    shape,
                    self.video_decoder,
                    self.audio_decoder,
                    self.reference_policy,
                    self._canvas_multiple,
                )
            timings.condition_encode_s = sw.seconds
            stages.mark("conditions")
            # one generator, as in diffusers: each visual condition's noise first, then the generated rows'
            generator = torch.Generator("cpu").manual_seed(seed)
            conditions = pack_conditions(
                encoded,
                text_rows=text.shape[1],
                shape=shape,
                generator=generator,
                patch_size=self.patch_size,
                device=device,
                timestep_scale=self.timestep_scale,
            )
            video, audio = draw_noise(shape, generator, device)
        video, audio = self._denoise(schedule, video, audio, text, cache, hooks, timings, stages, conditions)
        frames, waveform = self._decode(video, audio, timings)
        stages.mark("decode")
        timings.pipeline_s = time.perf_counter() - started
        peak_bytes, peak_kind = peak_memory(device)
        if stages.allocated:
            peak_bytes, peak_kind = max(stages.allocated.values()), "cuda_max_memory_allocated"

        stats = cache.stats() if cache is not None else {"computed": schedule.num_dit_calls, "skipped": 0}
        request = {
            "prompt": prompt,
            "task": conditioned.task,
            **({"conditions": conditioned.describe()} if conditions is not None else {}),
            "duration_s": duration,
            "resolution": resolution if not isinstance(resolution, tuple) else list(resolution),
            "aspect_ratio": aspect_ratio,
            "steps": steps,
            "dit_calls": schedule.num_dit_calls,
            "seed": seed,
            "flow_shift": flow_shift,
            "audio_flow_shift": audio_flow_shift,
            "feature_cache": type(cache).__name__ if cache is not None else "none",
            "device": str(device),
            "world_size": dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1,
        }
        return MiniMaxH3Result(
            frames=frames,
            audio=waveform,
            shape=shape,
            timings=timings,
            peak_memory_bytes=peak_bytes,
            peak_memory_kind=peak_kind,
            dit_calls_computed=int(stats["computed"]),
            dit_calls_skipped=int(stats["skipped"]),
            weights=dict(self.weights),
            request=request,
            video_latents=video.float().cpu(),
            audio_latents=audio.float().cpu(),
            feature_cache=cache,
            stage_peak_bytes=stages.as_dict(),
        )

    def _check_task(self, task: str) -> None:
        if task not in PARTITION_TASKS[self.partition]:
            needed = partition_for_task(task)
            what = {"ref2va": "references", "fl2va": "keyframes", "t2va": "no keyframes or references"}[task]
            raise ValueError(
                f"a {task} request ({what}) runs on the {needed} DiT, but this pipeline holds the {self.partition} "
                f"one: build it with build_minimax_h3_pipeline(..., partition={needed!r})"
            )

    @property
    def _canvas_multiple(self) -> int:
        return 16 * max(self.patch_size[1], self.patch_size[2])

    def _denoise(
        self, schedule: FlowSchedule, video, audio, text, cache, hooks: StepHooks, timings, stages, conditions=None
    ):
        """Every DiT call of the schedule, timed one by one, with the hooks around each."""
        device, total = self.device, schedule.num_dit_calls
        with Stopwatch(device) as sw:
            adaln = self._precompute_adaln(schedule, video.shape[0], conditions)
        timings.adaln_tables_s = sw.seconds
        stages.mark("tables")
        try:
            bar = tqdm(range(total), desc="MiniMax H3 DiT", unit="call", disable=not self._progress_on_this_rank())
            for step in bar:
                if hooks.cancelled():
                    raise GenerationCancelled(step)
                with Stopwatch(device) as sw:
                    video, audio = self._denoise_step(schedule, step, video, audio, text, cache, adaln, conditions)
                timings.dit_step_s.append(sw.seconds)
                hooks.progress(step + 1, total)
        finally:
            if adaln is not None:
                adaln.clear()  # the request's tables go with it, also on an error or a cancel
        stages.mark("denoise")
        timings.dit_total_s = sum(timings.dit_step_s)
        return video, audio

    def _decode(self, video, audio, timings) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 frames [F, H, W, 3] and the waveform [2, samples] in [-1, 1], both on the CPU."""
        with Stopwatch(self.device) as sw:
            pixels = self.video_decoder(video)
        timings.video_decode_s = sw.seconds
        with Stopwatch(self.device) as sw:
            waveform = self.audio_decoder(audio)
        timings.audio_decode_s = sw.seconds
        return to_uint8_frames(pixels)[0], waveform[0].float().clamp(-1.0, 1.0).cpu()

    def _dit_times(self, schedule: FlowSchedule, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """DiT call `step`'s (t_video, t_audio), [batch] each in [0, timestep_scale], on the device."""
        t_video, t_audio = schedule.model_times(step)
        tv = (t_video * self.timestep_scale).to(self.device, torch.float32).expand(batch)
        ta = (t_audio * self.timestep_scale).to(self.device, torch.float32).expand(batch)
        return tv, ta

    def _precompute_adaln(self, schedule: FlowSchedule, batch: int, conditions=None):
        """The AdaLN tables of every DiT call of the schedule (a feature cache may skip some: a few unused), or
        None when disabled or the DiT cannot make them. Under TP a collective, on every rank alike."""
        precompute = getattr(self.dit, "precompute_adaln", None)
        if not self.adaln_tables or not callable(precompute):
            return None
        times = [self._dit_times(schedule, step, batch) for step in range(schedule.num_dit_calls)]
        extra = {} if conditions is None else {"conditions": conditions}  # their rows' timesteps are in the tables
        return precompute([tv for tv, _ in times], [ta for _, ta in times], **extra)

    def _denoise_step(self, schedule: FlowSchedule, step: int, video, audio, text, cache, adaln=None, conditions=None):
        if cache is not None:
            cache.set_step(step)
        tv, ta = self._dit_times(schedule, step, video.shape[0])
        tables = {} if adaln is None else {"adaln": adaln}  # a DiT without tables keeps its own call signature
        if conditions is not None:  # T2VA calls keep the signature of a DiT without conditions, too
            tables["conditions"] = conditions
        v_video, v_audio = self.dit(video, audio, text, tv, ta, block_hook=cache, **tables)
        if v_video.shape != video.shape or v_audio.shape != audio.shape:
            raise RuntimeError(
                f"DiT returned velocities {tuple(v_video.shape)} / {tuple(v_audio.shape)} for latents "
                f"{tuple(video.shape)} / {tuple(audio.shape)}"
            )
        return schedule.step(step, video, audio, v_video, v_audio)

    def _feature_cache(self, feature_cache, num_dit_calls: int):
        if feature_cache is None or feature_cache == "none":
            return None
        if feature_cache == "ada_taylor":
            params = AdaTaylorParams.load(params_path("minimax_h3"))
            self._warn_if_placeholder(params)
            return AdaTaylorCache(params, num_dit_calls)
        if feature_cache == "calibrator":
            return AdaTaylorCacheCalibrator(num_dit_calls)
        if isinstance(feature_cache, str) or not callable(getattr(feature_cache, "set_step", None)):
            raise ValueError(f"feature_cache must be None, 'ada_taylor', 'calibrator' or a hook, got {feature_cache!r}")
        params = getattr(feature_cache, "params", None)
        if isinstance(params, AdaTaylorParams):
            self._warn_if_placeholder(params)
        return feature_cache

    def _warn_if_placeholder(self, params: AdaTaylorParams) -> None:
        """Placeholder ratios (calibrated on random weights) decide which steps a real model skips: say so."""
        weights = str(getattr(self.dit, "weights_source", ""))
        if params.is_placeholder and weights.startswith(CHECKPOINT_PREFIX):
            log.warning(
                "AdaTaylorCache: the bundled MiniMax H3 parameters are a PLACEHOLDER calibrated on random weights, "
                "but the DiT has real weights (%s): skipped steps are chosen from meaningless ratios and quality "
                "may suffer. Calibrate on these weights (run_t2va.py --calibrate-feature-cache PATH) and use that.",
                weights,
            )

    def _progress_on_this_rank(self) -> bool:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return self.show_progress and rank == 0


def _check_request(prompt: str, steps: int) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt must be a non-empty string")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an integer >= 2 (N sigma points give N-1 DiT calls), got {steps!r}")


def initial_noise(shape: MiniMaxH3Shape, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Video [1, 24, T, h, w] and audio [1, 32, 2 * Ta] fp32 noise from one CPU generator, video first (identical on
    every rank, and to diffusers' pipeline given ``torch.Generator("cpu").manual_seed(seed)``)."""
    return draw_noise(shape, torch.Generator("cpu").manual_seed(seed), device)


def draw_noise(
    shape: MiniMaxH3Shape, generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """`initial_noise` from a given CPU generator (FL2VA / Ref2VA: after the conditions' draws)."""
    video = torch.randn(shape.video_latent_shape, generator=generator)
    # drawn as token rows [2 * Ta, 32] like the reference; transposing keeps the same numbers per token
    rows = torch.randn(shape.audio_tokens, AUDIO_LATENT_CHANNELS, generator=generator)
    audio = rows.t().unsqueeze(0).contiguous()
    assert video.shape[1] == VIDEO_LATENT_CHANNELS
    return video.to(device), audio.to(device)


def to_uint8_frames(pixels: torch.Tensor) -> torch.Tensor:
    """[B, 3, F, H, W] in [0, 1] -> uint8 [B, F, H, W, 3] on the CPU (diffusers' ``numpy_to_pil`` rounding)."""
    scaled = (pixels.float().clamp(0.0, 1.0) * 255).round().to(torch.uint8)
    return scaled.permute(0, 2, 3, 4, 1).contiguous().cpu()
