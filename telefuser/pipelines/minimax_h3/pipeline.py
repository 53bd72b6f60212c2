"""MiniMax H3 text -> video + audio: encode the prompt, denoise both latents with one DiT, decode.

The DiT is injected (its contract is in this folder's README); noise follows diffusers' MiniMax H3 pipeline, so a
run is comparable with it seed for seed. Progress and cancellation are the call's own (`hooks`: pipelines/hooks.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from telefuser.feature_cache import AdaTaylorCache, AdaTaylorCacheCalibrator, AdaTaylorParams, params_path
from telefuser.profiling.timing import MemoryPeaks, Stopwatch, peak_memory, reset_peak_memory, synchronize

from ..hooks import NO_HOOKS, GenerationCancelled, StepHooks
from ..request_boundary import reset_parallel
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


@dataclass
class MiniMaxH3Timings:
    pipeline_s: float = 0.0
    text_encode_s: float = 0.0
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
    """One T2VA request per call. Holds its components; `close()` releases the DiT's parallel state."""

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
    ) -> None:
        """`adaln_tables`: precompute each request's AdaLN tables (`MiniMaxH3DiT.precompute_adaln`, exact) when the
        DiT has the method; required when its projections are offloaded (`offload_adaln` turns it on). Off by
        default until the path has run on a GPU: the per-call projections are what was measured there."""
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
        aspect_ratio: str = "16:9",
        steps: int = DEFAULT_NUM_STEPS,
        seed: int = 0,
        flow_shift: float = DEFAULT_VIDEO_FLOW_SHIFT,
        audio_flow_shift: float = DEFAULT_AUDIO_FLOW_SHIFT,
        feature_cache=None,
        hooks: StepHooks = NO_HOOKS,
    ) -> MiniMaxH3Result:
        """Generate one clip. `feature_cache`: None / "none", "ada_taylor" (bundled H3 parameters), or a hook
        object with ``set_step`` (an `AdaTaylorCache` with other parameters, an `AdaTaylorCacheCalibrator`).

        `hooks` (pipelines/hooks.py): ``progress(done, total)`` runs after each DiT call; ``cancelled()`` is asked
        before each, and a True answer raises `GenerationCancelled` (under Ulysses/TP every rank must give the same
        answers)."""
        _check_request(prompt, steps)
        shape = self.plan(duration=duration, resolution=resolution, aspect_ratio=aspect_ratio)
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
        video, audio = initial_noise(shape, seed, device)
        video, audio = self._denoise(schedule, video, audio, text, cache, hooks, timings, stages)
        frames, waveform = self._decode(video, audio, timings)
        stages.mark("decode")
        timings.pipeline_s = time.perf_counter() - started
        peak_bytes, peak_kind = peak_memory(device)
        if stages.allocated:
            peak_bytes, peak_kind = max(stages.allocated.values()), "cuda_max_memory_allocated"

        stats = cache.stats() if cache is not None else {"computed": schedule.num_dit_calls, "skipped": 0}
        request = {
            "prompt": prompt,
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

    def _denoise(self, schedule: FlowSchedule, video, audio, text, cache, hooks: StepHooks, timings, stages):
        """Every DiT call of the schedule, timed one by one, with the hooks around each."""
        device, total = self.device, schedule.num_dit_calls
        with Stopwatch(device) as sw:
            adaln = self._precompute_adaln(schedule, video.shape[0])
        timings.adaln_tables_s = sw.seconds
        stages.mark("tables")
        try:
            bar = tqdm(range(total), desc="MiniMax H3 DiT", unit="call", disable=not self._progress_on_this_rank())
            for step in bar:
                if hooks.cancelled():
                    raise GenerationCancelled(step)
                with Stopwatch(device) as sw:
                    video, audio = self._denoise_step(schedule, step, video, audio, text, cache, adaln)
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

    def _precompute_adaln(self, schedule: FlowSchedule, batch: int):
        """The AdaLN tables of every DiT call of the schedule (a feature cache may skip some: a few unused), or
        None when disabled or the DiT cannot make them. Under TP a collective, on every rank alike."""
        precompute = getattr(self.dit, "precompute_adaln", None)
        if not self.adaln_tables or not callable(precompute):
            return None
        times = [self._dit_times(schedule, step, batch) for step in range(schedule.num_dit_calls)]
        return precompute([tv for tv, _ in times], [ta for _, ta in times])

    def _denoise_step(self, schedule: FlowSchedule, step: int, video, audio, text, cache, adaln=None):
        if cache is not None:
            cache.set_step(step)
        tv, ta = self._dit_times(schedule, step, video.shape[0])
        tables = {} if adaln is None else {"adaln": adaln}  # a DiT without tables keeps its own call signature
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
    generator = torch.Generator("cpu").manual_seed(seed)
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
