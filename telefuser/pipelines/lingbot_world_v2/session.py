"""LingBot-World v2 as a session: one reference image + prompt, then chunks of frames on demand, steered by keys.

``start`` validates the request, encodes the prompt, draws the session's noise and opens the DiT's KV window, the
VAE streams and a camera track; ``next_chunk(keys)`` runs the reference's chunk loop (4 denoising forwards, the
clean-KV commit, the streamed decode) and times its phases. The loop, the API and the phases: this folder's README.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from telefuser.profiling.timing import PhaseClock

from ..chunk import Chunk
from ..hooks import NO_HOOKS, GenerationCancelled, StepHooks
from ..request_boundary import reset_parallel
from ..wan.vae import LATENT_CHANNELS, to_uint8_frames
from .camera_control import CameraFactory, CameraGeometry, no_camera
from .controls import normalize_keys
from .image import image_to_canvas, load_reference_image
from .metrics import summarize
from .request import (
    CHUNK_LATENT_FRAMES,
    DEFAULT_FPS,
    DEFAULT_FRAME_POLICY,
    DEFAULT_NUM_FRAMES,
    DEFAULT_RESOLUTION,
    DEFAULT_SEED,
    PATCH_SIZE,
    SessionShape,
    plan_session,
)
from .scheduler import DenoisingSchedule, flow_to_x0, renoise

MASK_CHANNELS = 4
CONDITION_ENCODINGS = ("upfront", "per_chunk")
DIT_IN_DIM = LATENT_CHANNELS + MASK_CHANNELS + LATENT_CHANNELS  # 36


class WorldSessionPipeline:
    """Holds the models; every `start` opens an independent session (its own KV cache, RNG, decode stream)."""

    def __init__(
        self,
        dit,
        prompt_encoder,
        vae,
        *,
        device: str | torch.device = "cpu",
        dit_dtype: torch.dtype = torch.float32,
        camera_factory: CameraFactory = no_camera,
        schedule: DenoisingSchedule | None = None,
        chunk_latent_frames: int = CHUNK_LATENT_FRAMES,
        vae_group=None,
        condition_encoding: str = "per_chunk",
        weights: dict | None = None,
    ) -> None:
        _check_dit(dit, prompt_encoder)
        self.dit = dit
        self.prompt_encoder = prompt_encoder
        self.vae = vae
        self.device = torch.device(device)
        self.dit_dtype = dit_dtype
        self.camera_factory = camera_factory
        self.schedule = schedule or DenoisingSchedule.build()
        self.chunk_latent_frames = int(chunk_latent_frames)
        self.vae_group = vae_group
        if condition_encoding not in CONDITION_ENCODINGS:
            raise ValueError(f"condition_encoding must be one of {CONDITION_ENCODINGS}, got {condition_encoding!r}")
        self.condition_encoding = condition_encoding
        self.weights = dict(weights or {})
        self._sharded: dict[int, object] = {}  # latent height -> HeightShardedDecoder (built once, stateless)

    def plan(self, **request) -> SessionShape:
        return plan_session(chunk_latent_frames=self.chunk_latent_frames, **request)

    def start(
        self,
        image,
        prompt: str,
        *,
        seed: int = DEFAULT_SEED,
        resolution=DEFAULT_RESOLUTION,
        num_frames: int = DEFAULT_NUM_FRAMES,
        fps: float = DEFAULT_FPS,
        frame_policy: str = DEFAULT_FRAME_POLICY,
        keep_latents: bool = False,
    ) -> WorldSession:
        plan = self.plan(resolution=resolution, num_frames=num_frames, fps=fps, frame_policy=frame_policy)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        rgb = load_reference_image(image)
        reset_parallel(self.dit)  # a request boundary: reopen the copy engine if an earlier session failed on it
        return WorldSession(self, plan, rgb, prompt, seed, keep_latents=keep_latents)

    def warm_up(self, *, resolution=DEFAULT_RESOLUTION, fps: float = DEFAULT_FPS) -> float:
        """Run and discard a session long enough that every chunk shape a service will see has run once (the first
        chunk, then each KV-window length until the window is full), so that no real chunk pays for kernel
        selection and compilation (seconds on CUDA). Collective under Ulysses: every rank calls it. Returns the
        seconds it took."""
        start = time.perf_counter()
        gray = np.full((64, 64, 3), 128, np.uint8)
        frames = 1 + 4 * (self.chunk_latent_frames * self.warm_up_chunks() - 1)
        session = self.start(
            gray, "warm-up", seed=0, resolution=resolution, num_frames=frames, fps=fps, frame_policy="strict"
        )
        try:
            while not session.done:
                session.next_chunk()
        finally:
            session.close()
        return time.perf_counter() - start

    def warm_up_chunks(self) -> int:
        """Chunks until every chunk reads a full KV window (key lengths differ until then): 5 for v2's 18-frame
        window and 4-frame chunks; 2 for a DiT that declares no window."""
        window = getattr(getattr(self.dit, "config", None), "local_attn_size", None)
        span = self.chunk_latent_frames
        return 2 if window is None else max(2, -(-(int(window) - span) // span) + 1)

    def sharded_decoder(self, latent_height: int):
        """The height-sharded decoder for this pipeline's VAE group, or None on a single rank."""
        if self.vae_group is None:
            return None
        import torch.distributed as dist

        if dist.get_world_size(self.vae_group) == 1:
            return None
        if latent_height not in self._sharded:
            from ..wan.vae_parallel import HeightShardedDecoder

            self._sharded[latent_height] = HeightShardedDecoder(self.vae.model.decoder, latent_height, self.vae_group)
        return self._sharded[latent_height]

    def close(self) -> None:
        self._sharded.clear()
        close = getattr(self.dit, "close", None)
        if callable(close):
            close()


class WorldSession:
    """One world session. `next_chunk(keys)` produces the chunks in order; `close()` frees the KV cache."""

    def __init__(
        self,
        pipe: WorldSessionPipeline,
        plan: SessionShape,
        rgb: np.ndarray,
        prompt: str,
        seed: int,
        *,
        keep_latents: bool = False,
    ) -> None:
        self.pipe = pipe
        self.plan = plan
        self.seed = seed
        self.keep_latents = keep_latents
        self.index = 0
        self.measurements: list[dict] = []
        self.keys_history: list[list[str]] = []
        self._closed = False
        self._failure: str | None = None  # set when a chunk fails half-way: the KV cache is no longer trustworthy
        self._kv_window = self._decoder = self._camera = self._encoder = None
        self._condition = None
        self.request = {
            "prompt": prompt,
            "seed": seed,
            "resolution": f"{plan.width}x{plan.height}",
            "num_frames": plan.requested_frames,
            "effective_frames": plan.num_frames,
            "fps": plan.fps,
            "frame_policy": plan.frame_policy,
        }
        try:
            self.setup_seconds = self._open(rgb, prompt)
        except BaseException:
            self.close()
            raise

    @torch.no_grad()
    def _open(self, rgb: np.ndarray, prompt: str) -> dict[str, float]:
        pipe, plan, device = self.pipe, self.plan, self.pipe.device
        clock = PhaseClock(device)
        # The reference draws the whole initial noise first, then the re-noise draws, all from one generator.
        self._generator = torch.Generator(device=device).manual_seed(self.seed)
        self._noise = torch.randn(
            LATENT_CHANNELS,
            plan.latent_frames,
            plan.latent_height,
            plan.latent_width,
            dtype=torch.float32,
            generator=self._generator,
            device=device,
        ).unsqueeze(0)
        context = pipe.prompt_encoder(prompt, device).to(pipe.dit_dtype)
        clock.lap("text_encode_s")
        canvas = image_to_canvas(rgb, plan.width, plan.height)
        if pipe.condition_encoding == "upfront":
            self._condition = self._with_mask(pipe.vae.encode_condition(canvas, plan.latent_frames).to(device), 0)
        else:
            self._encoder = pipe.vae.stream_encoder(canvas)
        clock.lap("image_encode_s")
        self._kv_window = pipe.dit.new_window(
            1, context, tokens_per_frame=plan.tokens_per_frame, device=device, dtype=pipe.dit_dtype
        )
        self._sharding = pipe.sharded_decoder(plan.latent_height)
        self._decoder = pipe.vae.stream_decoder(self._sharding)
        geometry = CameraGeometry(
            plan.width, plan.height, plan.latent_width, plan.latent_height, plan.chunk_latent_frames, plan.fps
        )
        self._camera = pipe.camera_factory(geometry, device, pipe.dit_dtype)
        clock.lap("session_init_s")
        self.open_peak_bytes = clock.memory.as_dict()
        return dict(clock.phases)

    def _with_mask(self, latents: torch.Tensor, first_latent_frame: int) -> torch.Tensor:
        """``[1, 4 + 16, F, h, w]``: the I2V mask (1 on the session's latent frame 0 only), then the latents."""
        mask = torch.zeros(1, MASK_CHANNELS, *latents.shape[2:], dtype=torch.float32, device=latents.device)
        if first_latent_frame == 0:
            mask[:, :, 0] = 1.0
        return torch.cat([mask, latents.float()], dim=1)

    @property
    def total_chunks(self) -> int:
        return self.plan.total_chunks

    @property
    def done(self) -> bool:
        return self.index >= self.plan.total_chunks

    @property
    def closed(self) -> bool:
        return self._closed

    def next_chunk(self, keys=(), hooks: StepHooks = NO_HOOKS) -> Chunk:
        """Produce the next chunk with `keys` held. A failure inside the chunk closes the session (its KV cache
        may hold a half-written chunk), and every later call says so. `hooks` (pipelines/hooks.py) hear each of the
        chunk's denoising steps; a cancel is such a failure too (the session's noise draws are spent)."""
        keys = normalize_keys(keys)
        if self._failure is not None:
            raise RuntimeError(f"session was closed after chunk {self.index} failed: {self._failure}")
        if self._closed:
            raise RuntimeError("session is closed")
        if self.done:
            raise RuntimeError(f"session already produced all {self.plan.total_chunks} chunks")
        try:
            return self._compute_chunk(keys, hooks)
        except BaseException as exc:
            self._failure = f"{type(exc).__name__}: {exc}"
            self.close()
            raise

    @torch.no_grad()
    def _compute_chunk(self, keys: tuple[str, ...], hooks: StepHooks) -> Chunk:
        pipe, plan, schedule, device = self.pipe, self.plan, self.pipe.schedule, self.pipe.device
        index, span = self.index, plan.chunk_latent_frames
        frames_slice = slice(index * span, (index + 1) * span)
        x = self._noise[:, :, frames_slice]

        clock = PhaseClock(device)
        if self._encoder is not None:
            cond = self._with_mask(self._encoder.next(span).to(device), index * span)
            clock.lap("condition_s")
        else:
            cond = self._condition[:, :, frames_slice]
        camera = self._camera.features(keys, index)
        if camera is not None:  # the camera's share of every block, once for the chunk's five forwards
            camera = pipe.dit.camera_modulation(camera)
        for step, t in enumerate(schedule.timesteps):
            if hooks.cancelled():
                raise GenerationCancelled(step)
            flow = pipe.dit.forward_chunk(
                self._kv_window, torch.cat([x, cond], dim=1), _t(t, device), camera, update_cache=False
            )
            x0 = flow_to_x0(flow, x, schedule.x0_sigmas[step])
            if step < schedule.num_steps - 1:
                noise = torch.randn(x0.shape, generator=self._generator, device=device, dtype=x0.dtype)
                x = renoise(x0, noise, schedule.renoise_sigmas[step])
            hooks.progress(step + 1, schedule.num_steps)
        clock.lap("dit_s")
        pipe.dit.commit_chunk(self._kv_window, torch.cat([x0, cond], dim=1), _t(0, device), camera)
        clock.lap("kv_update_s")
        pixels = self._decoder.decode(x0)
        clock.lap("decode_s")
        frames = to_uint8_frames(pixels)
        if self._sharding is not None:
            frames = self._sharding.gather_frames(frames)
        frames = frames.cpu().numpy()
        clock.lap("convert_s")

        measurement = {
            "index": index,
            "frames": int(frames.shape[0]),
            "compute_seconds": clock.total,
            "phases": dict(clock.phases),  # dit_s, kv_update_s, decode_s, convert_s (+ condition_s per chunk)
            "peak_bytes": clock.memory.as_dict(),  # per phase, on CUDA: allocated and reserved
        }
        self.measurements.append(measurement)
        self.keys_history.append(list(keys))
        self.index += 1
        latents = x0.detach().cpu() if self.keep_latents else None
        return Chunk(index, frames, measurement, keys, latents)

    def summary(self) -> dict:
        return summarize(self.measurements)

    def close(self) -> None:
        """Free the KV cache, the decode cache and the session's tensors; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for part in (self._kv_window, self._decoder, self._encoder, self._camera):
            close = getattr(part, "close", None)
            if callable(close):
                close()
        self._kv_window = self._decoder = self._encoder = self._camera = None
        self._noise = self._condition = self._generator = None

    def __enter__(self) -> WorldSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _t(value: int, device: torch.device) -> torch.Tensor:
    return torch.full((1,), float(value), dtype=torch.float32, device=device)


def _check_dit(dit, prompt_encoder) -> None:
    """Refuse a DiT whose declared shapes cannot take this pipeline's inputs (checked only where declared)."""
    config = getattr(dit, "config", None)
    if config is None:
        return
    in_dim = getattr(config, "in_dim", DIT_IN_DIM)
    if int(in_dim) != DIT_IN_DIM:
        raise ValueError(
            f"DiT in_dim is {in_dim}, but the session feeds {DIT_IN_DIM} channels "
            f"(16 noisy latent + 4 mask + 16 image latent)"
        )
    out_dim = getattr(config, "out_dim", LATENT_CHANNELS)
    if int(out_dim) != LATENT_CHANNELS:
        raise ValueError(f"DiT out_dim is {out_dim}, expected {LATENT_CHANNELS} (the Wan VAE's latent channels)")
    patch = tuple(getattr(config, "patch_size", PATCH_SIZE))
    if patch != PATCH_SIZE:
        raise ValueError(f"DiT patch size {patch} is not {PATCH_SIZE}; the request checks assume (1, 2, 2)")
    text_dim = getattr(config, "text_dim", None)
    if text_dim is not None and int(text_dim) != prompt_encoder.hidden_size:
        raise ValueError(f"DiT text_dim {text_dim} != text encoder width {prompt_encoder.hidden_size}")
