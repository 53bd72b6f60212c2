"""Wan 2.2 text(+image)-to-video: prompt -> umT5 states -> flow-matching UniPC denoise (two experts switched at the
boundary timestep, CFG batched as one B=2 DiT call) -> one VAE decode.

    pipe = build_wan22_pipeline(variant="t2v-a14b", config="tiny")           # loading.py
    video = pipe("a red fox in the snow", seed=0)                            # Wan22Video: uint8 frames [T, H, W, 3]
    video = ti2v_pipe("the fox runs", image=Image.open("fox.png"))           # TI2V-5B: the image is the first frame

`denoise` is the loop alone (latents and encoder states in, latents out): what the parity tests run beside diffusers'
``WanPipeline`` and, with TI2V-5B's image condition, ``WanImageToVideoPipeline(expand_timesteps=True)``. The
scheduler is diffusers' ``UniPCMultistepScheduler`` with flow sigmas, as Wan 2.2 samples.

TI2V-5B's image condition, as diffusers' ``WanImageToVideoPipeline`` with ``expand_timesteps=True`` runs it: the image
is stretched onto the canvas (PIL LANCZOS, diffusers' ``VideoProcessor.preprocess``), scaled to [-1, 1] and
VAE-encoded as one latent frame (the posterior's mode, normalised): the condition. Each step the model sees the
latents with latent frame 0 replaced by the condition, and that frame's tokens run at timestep 0 while the others run
at t (a timestep per token); the scheduler steps the latents themselves, and the condition replaces frame 0 once more
before the decode. diffusers writes the replacement as ``(1 - mask) * condition + mask * latents`` with a 0/1 mask:
for finite values that is the copy done here, bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from ...models.wan2_2.config import Wan22Release
from ..hooks import NO_HOOKS, GenerationCancelled, StepHooks
from ..request_boundary import reset_parallel
from ..wan.vae import to_uint8_frames

NUM_TRAIN_TIMESTEPS = 1000


def flow_scheduler(flow_shift: float):
    """Wan 2.2's sampler: UniPC (order 2) over flow-matching sigmas shifted by `flow_shift`."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(
        num_train_timesteps=NUM_TRAIN_TIMESTEPS,
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=flow_shift,
    )


@dataclass
class Wan22Video:
    frames: np.ndarray  # uint8 [T, H, W, 3]
    latents: torch.Tensor  # normalised, [1, C, F, h, w] fp32
    fps: int
    dit_calls: int
    timings: dict[str, float] = field(default_factory=dict)


class Wan22Pipeline:
    def __init__(
        self,
        experts: Sequence,
        prompt_encoder,
        vae,
        release: Wan22Release,
        *,
        device: torch.device | str = "cpu",
        vae_group=None,
        weights: dict[str, str] | None = None,
        homes: Sequence | None = None,
    ):
        """`experts`: the DiTs, high-noise first (two for T2V-A14B, one for TI2V-5B). `vae_group`: a process group
        whose ranks each decode a band of rows (`HeightShardedDecoder`, Wan 2.1's VAE), None to decode whole.
        `homes`: per expert, its `memory.host.HostResident` (its weights in host memory, lent to the device while its
        steps run: the model tier) or None (resident); None: every expert resident."""
        if len(experts) != release.experts:
            raise ValueError(f"Wan 2.2 {release.name} runs {release.experts} expert(s), got {len(experts)}")
        homes = list(homes) if homes is not None else [None] * len(experts)
        if len(homes) != len(experts) or any(h is not None and h.module is not e for h, e in zip(homes, experts)):
            raise ValueError("homes must hold, per expert, None or that expert's HostResident")
        self.experts = list(experts)
        self.homes = homes
        self.prompt_encoder = prompt_encoder
        self.vae = vae
        self.release = release
        self.device = torch.device(device)
        self.vae_group = vae_group if release.vae == "wan2.1" else None  # Wan 2.2's VAE decodes on each rank
        self._sharding: dict[int, object] = {}  # latent height -> its HeightShardedDecoder
        self.weights = dict(weights or {})

    # -- shapes -------------------------------------------------------------------------------------------------------
    def latent_shape(self, width: int, height: int, num_frames: int) -> tuple[int, int, int, int]:
        """(C, F, h, w) of a clip; ValueError naming the rule a size breaks."""
        multiple = self.release.vae_scale * 2  # the VAE's stride times the DiT's 2x2 patch
        if width % multiple or height % multiple or width < multiple or height < multiple:
            raise ValueError(f"width and height must be positive multiples of {multiple}, got {width}x{height}")
        if num_frames < 1 or (num_frames - 1) % 4:
            raise ValueError(
                f"num_frames must be 4n + 1 (the VAE's causal first frame, then 4 per latent), got {num_frames}"
            )
        scale = self.release.vae_scale
        return self.release.dit.in_dim, (num_frames - 1) // 4 + 1, height // scale, width // scale

    def _vae_sharding(self, latent_height: int):
        if self.vae_group is None:
            return None
        if latent_height not in self._sharding:
            from ..wan.vae_parallel import HeightShardedDecoder

            self._sharding[latent_height] = HeightShardedDecoder(self.vae.model.decoder, latent_height, self.vae_group)
        return self._sharding[latent_height]

    # -- one request --------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(
        self,
        prompt: str,
        *,
        negative_prompt: str = "",
        width: int | None = None,
        height: int | None = None,
        num_frames: int | None = None,
        steps: int | None = None,
        guidance_scale: float | None = None,
        guidance_scale_2: float | None = None,
        seed: int = 0,
        image=None,
        hooks: StepHooks = NO_HOOKS,
    ) -> Wan22Video:
        """The release's canvas, frames, steps and guidance where not given. The initial noise comes from one CPU
        generator seeded with `seed` (the same on every rank and device). `image` (TI2V-5B only; a PIL image): the
        first frame, stretched onto the canvas. `hooks`: ``progress(done, total)`` after each step, ``cancelled()``
        before each (`GenerationCancelled`)."""
        release = self.release
        if image is not None and not release.takes_image:
            raise ValueError(
                f"Wan 2.2 {release.name} is text-to-video only: an image conditions TI2V-5B (diffusers' A14B "
                "image-to-video is another checkpoint, Wan2.2-I2V-A14B, not served here)"
            )
        width, height = width or release.size[0], height or release.size[1]
        shape = self.latent_shape(width, height, num_frames or release.frames)
        pixels = image_pixels(image, width, height) if image is not None else None  # a bad image fails before work
        reset_parallel(self.experts[0])  # a request boundary; the experts share one communicator (loading.py)
        timings = {}
        start = time.perf_counter()
        text = self.prompt_encoder(prompt, self.device)
        negative = self.prompt_encoder(negative_prompt, self.device, allow_empty=True)
        timings["text_encode_s"] = time.perf_counter() - start
        condition = None
        if pixels is not None:
            start = time.perf_counter()
            condition = self.encode_image(pixels)
            timings["image_encode_s"] = time.perf_counter() - start
        noise = torch.randn(1, *shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
        start = time.perf_counter()
        guidance = (
            guidance_scale if guidance_scale is not None else release.guidance[0],
            guidance_scale_2 if guidance_scale_2 is not None else release.guidance[1],
        )
        latents, calls = self.denoise(noise.to(self.device), text, negative, steps=steps or release.steps,
                                      guidance=guidance, hooks=hooks, condition=condition)  # fmt: skip
        timings["denoise_s"] = time.perf_counter() - start
        start = time.perf_counter()
        sharding = self._vae_sharding(shape[2])
        frames = to_uint8_frames(self.vae.decode(latents, sharding))
        if sharding is not None:
            frames = sharding.gather_frames(frames)
        timings["decode_s"] = time.perf_counter() - start
        return Wan22Video(frames.cpu().numpy(), latents.cpu(), release.fps, calls, timings)

    @torch.no_grad()
    def denoise(
        self,
        latents: torch.Tensor,
        text: torch.Tensor,
        negative_text: torch.Tensor | None,
        *,
        steps: int,
        guidance: tuple[float, float],
        hooks: StepHooks = NO_HOOKS,
        boundary_ratio: float | None = None,
        condition: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, int]:
        """`steps` UniPC steps from `latents` ``[B, C, F, h, w]`` (fp32); returns (latents, DiT calls). Each step
        runs the high-noise expert while ``t >= boundary_ratio * 1000`` (the release's boundary unless given), then
        the low-noise one, with that expert's guidance; with guidance above 1 (the high-noise expert's, as
        diffusers decides) the conditional and unconditional predictions come from one batched call. `condition`
        ``[1, C, 1, h, w]`` (`encode_image`): the first latent frame, held at timestep 0 (`first_frame_timesteps`);
        the latents returned carry it."""
        release = self.release
        boundary = release.boundary_ratio if boundary_ratio is None else boundary_ratio
        boundary_t = None if boundary is None or len(self.experts) == 1 else boundary * NUM_TRAIN_TIMESTEPS
        cfg = guidance[0] > 1.0 and negative_text is not None
        batch = latents.shape[0]
        states = text.expand(batch, -1, -1)
        if cfg:
            states = torch.cat([states, negative_text.expand(batch, -1, -1)])
        scheduler = flow_scheduler(release.flow_shift)
        scheduler.set_timesteps(steps, device=latents.device)
        scheduler.set_begin_index(0)
        current, dit, text_kv = None, None, None  # the running expert, its module, its prompt K/V
        with ExitStack() as lent:  # the running expert's device copy, where it lives in host memory
            for i, t in enumerate(scheduler.timesteps):
                if hooks.cancelled():
                    raise GenerationCancelled(i)
                expert = 0 if boundary_t is None or t >= boundary_t else 1
                if expert != current:  # the switch: the idle expert's device copy and K/V go before the next comes
                    dit = text_kv = None
                    lent.close()
                    dit = lent.enter_context(self.expert_on_device(expert))
                    text_kv = dit.text_kv(states.to(dit.compute_dtype))
                    current = expert
                x = latents if condition is None else with_first_frame(latents, condition)
                x = torch.cat([x, x]) if cfg else x
                flow = dit(x.to(dit.compute_dtype), self._timesteps(t, x, condition, dit), text_kv).float()
                if cfg:
                    cond, uncond = flow.chunk(2)
                    flow = uncond + guidance[expert] * (cond - uncond)
                latents = scheduler.step(flow, t, latents, return_dict=False)[0]
                hooks.progress(i + 1, steps)
        if condition is not None:
            latents = with_first_frame(latents, condition)
        return latents, steps

    @torch.no_grad()
    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """The first frame's condition: pixels ``[3, H, W]`` in [-1, 1] (`image_pixels`) VAE-encoded as one
        latent frame (the posterior's mode), normalised: ``[1, C, 1, H/16, W/16]`` fp32 on the pipeline's device."""
        return self.vae.encode_condition(pixels, 1).to(self.device)

    @staticmethod
    def _timesteps(t: torch.Tensor, x: torch.Tensor, condition: torch.Tensor | None, dit) -> torch.Tensor:
        """The DiT's timesteps for the batch `x`: t for every sample, or per token with the condition's frame at 0."""
        if condition is None:
            return t.expand(x.shape[0]).to(x.device)
        return first_frame_timesteps(t, x.shape[0], tuple(x.shape[2:]), dit.config.patch_size).to(x.device)

    def expert_on_device(self, index: int):
        """A context holding expert `index` on the device: lent from host memory for the block (its device copy
        freed after, also after an error), or as it is when resident."""
        home = self.homes[index]
        return home.on(self.device) if home is not None else nullcontext(self.experts[index])


# -- TI2V-5B's first-frame condition -----------------------------------------------------------------------------------
IMAGE_MODES = ("RGB", "RGBA", "L", "P")  # what converts to RGB as diffusers' load_image does


def image_pixels(image, width: int, height: int) -> torch.Tensor:
    """A PIL image -> float32 ``[3, height, width]`` in [-1, 1]: RGB, resized with LANCZOS (untouched at the canvas
    size), ``2 * (v / 255) - 1``; ValueError naming what is wrong with `image`."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise ValueError(f"the image must be a PIL image, got {type(image).__name__}")
    if image.mode not in IMAGE_MODES:
        raise ValueError(f"image mode {image.mode!r} is not supported; use one of {', '.join(IMAGE_MODES)}")
    if image.width == 0 or image.height == 0:
        raise ValueError("the image is empty")
    rgb = image.convert("RGB")
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.LANCZOS)
    unit = np.asarray(rgb, dtype=np.float32) / 255.0  # the same float32 arithmetic as diffusers' pil_to_numpy
    return torch.from_numpy(2.0 * unit - 1.0).permute(2, 0, 1).contiguous()


def with_first_frame(latents: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
    """`latents` ``[B, C, F, h, w]`` with latent frame 0 replaced by `condition` ``[1, C, 1, h, w]``."""
    return torch.cat([condition.expand(latents.shape[0], -1, -1, -1, -1).to(latents.dtype), latents[:, :, 1:]], dim=2)


def first_frame_timesteps(
    t: torch.Tensor, batch: int, latent_grid: tuple[int, int, int], patch_size: tuple[int, int, int]
) -> torch.Tensor:
    """Per-token timesteps ``[batch, N]`` (float32, raster (f, h, w) token order): 0 for the tokens of latent frame 0,
    the scheduler's t for every other (diffusers: ``(mask[0][0][:, ::2, ::2] * t).flatten()``)."""
    frames, height, width = latent_grid
    pt, ph, pw = patch_size
    if pt != 1:
        raise ValueError(f"the first-frame condition needs a temporal patch of 1, got patch_size {patch_size}")
    per_frame = (height // ph) * (width // pw)
    timesteps = t.to(torch.float32).expand(batch, frames * per_frame).clone()
    timesteps[:, :per_frame] = 0.0
    return timesteps
