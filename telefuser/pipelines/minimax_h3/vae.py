"""Latents -> pixels and waveform for MiniMax H3, through diffusers' VAE classes.

`VideoDecoder` and `AudioDecoder` do what diffusers' MiniMax H3 decode steps do around ``AutoencoderKLMiniMaxH3``
and ``AutoencoderKLMiniMaxH3Audio`` (this folder's README). Without a checkpoint the same classes get seeded random
weights, at ``tiny`` or ``official`` size, and say so; loading from files is `vae_checkpoint.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from telefuser.memory.host import HostResident
from telefuser.models.checkpoint_io import RANDOM_WEIGHTS, fill_random, finish_loading

from .shapes import AUDIO_CHANNELS
from .vae_checkpoint import OFFICIAL_VIDEO_VAE, VAECheckpointError, build_empty, keeps_fp32, place

# diffusers' MiniMaxH3ModularPipeline.pixel_mean / pixel_std: the video VAE works in ImageNet-normalized RGB
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)

# CPU-sized variants with the released geometry (16x spatial, 4x temporal, clip 17 / token drop 3, 24 and 32
# latent channels, hop 800), for tests and the tiny demo.
TINY_VIDEO_VAE = {
    **OFFICIAL_VIDEO_VAE,
    "block_out_channels": (32, 32, 32, 32),
    "layers_per_block": 1,
    "spatial_downsample_factors": (2, 2, 2, 2),
    "temporal_downsample_factors": (1, 2, 2, 1),
    "decoder_num_layers": 2,
    "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 16,
    "decoder_num_register_tokens": 2,
    "decoder_ffn_mult": 2,
}
TINY_AUDIO_VAE = {  # two stages and one AMP block per stage: CPU cost is per operation at these sizes
    "encoder_dim": 4,
    "encoder_rates": (20, 40),
    "latent_dim": 32,
    "num_attention_heads": 2,
    "decoder_dim": 16,
    "decoder_rates": (20, 40),
    "decoder_kernel_sizes": (40, 80),
    "resblock_kernel_sizes": (3,),
    "resblock_dilation_sizes": ((1,),),
}
# diffusers' audio class has no default latent statistics (the release ships them); random weights get identity ones
_IDENTITY_AUDIO_STATS = {"latents_mean": [0.0] * 32, "latents_std": [1.0] * 32}


class _Decoder(nn.Module):
    """A VAE that decodes where its weights are, or, with `lend_to`, lives in pinned host memory and is lent to that
    device for each decode (`memory.host.HostResident`: the offload tiers' VAE)."""

    def __init__(self, vae, description: str, lend_to: torch.device | str | None = None) -> None:
        super().__init__()
        self.vae = vae
        self.description = description + ("" if lend_to is None else ", kept in host memory between decodes")
        self._lend_to = None if lend_to is None else torch.device(lend_to)
        self._resident = None if lend_to is None else HostResident(vae)

    @contextmanager
    def _on_device(self) -> Iterator[torch.device]:
        if self._resident is None:
            yield next(self.vae.parameters()).device
            return
        with self._resident.on(self._lend_to):
            yield self._lend_to


class VideoDecoder(_Decoder):
    """Normalized latents [B, 24, T, h, w] -> RGB [B, 3, F, 16h, 16w] in [0, 1], float32, F = 17n + 5."""

    @torch.no_grad()
    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        config = self.vae.config
        if latents.ndim != 5 or latents.shape[1] != config.latent_channels:
            raise ValueError(
                f"video latents must be [B, {config.latent_channels}, T, h, w], got {tuple(latents.shape)}"
            )
        with self._on_device() as device:
            return self._decode(latents, device)

    def _decode(self, latents: torch.Tensor, device: torch.device) -> torch.Tensor:
        config = self.vae.config
        mean = torch.tensor(config.latents_mean, device=device).view(1, -1, 1, 1, 1)
        std = torch.tensor(config.latents_std, device=device).view(1, -1, 1, 1, 1)
        video = self.vae.decode(latents.to(device, torch.float32) * std + mean, return_dict=False)[0]
        pixel_mean = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
        pixel_std = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
        return (video.float() * pixel_std + pixel_mean).clamp(0, 1)


class AudioDecoder(_Decoder):
    """DiT audio tokens [B, 32, 2T] (left channel's T, then right's; normalized) -> stereo [B, 2, T * 800] fp32."""

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        with self._on_device() as device:
            return self._decode(tokens, device)

    def _decode(self, tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
        config = self.vae.config
        mono = split_stereo_tokens(tokens.to(device, torch.float32))
        mean = torch.tensor(config.latents_mean, device=device).view(1, -1, 1)
        std = torch.tensor(config.latents_std, device=device).view(1, -1, 1)
        wave = self.vae.decode(mono * std + mean, return_dict=False)[0]
        return wave.float().reshape(tokens.shape[0], AUDIO_CHANNELS, -1)


def split_stereo_tokens(audio_tokens: torch.Tensor) -> torch.Tensor:
    """DiT audio tokens [B, 32, 2T] (left channel's T tokens, then right's) -> mono latents [B * 2, 32, T]."""
    b, c, n = audio_tokens.shape
    if n % AUDIO_CHANNELS:
        raise ValueError(f"audio token count {n} is not a multiple of {AUDIO_CHANNELS} channels")
    t = n // AUDIO_CHANNELS
    return audio_tokens.reshape(b, c, AUDIO_CHANNELS, t).permute(0, 2, 1, 3).reshape(b * AUDIO_CHANNELS, c, t)


# -- random weights ------------------------------------------------------------------------------------------------
def _random_tensor(name: str, param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Weights ~ N(0, 1/fan_in), small biases, scales near 1; the ViT's residual scales start small."""
    noise = torch.randn(param.shape, generator=generator, dtype=torch.float32, device=generator.device)
    if name.endswith(".bias"):
        return 0.02 * noise
    if name.endswith(("scale1", "scale2")):
        return 0.1 + 0.01 * noise
    if param.dim() == 1 or name.endswith(("weight_g", ".alpha", ".beta")):  # norm scales, weight norms, Snake
        return 1.0 + 0.1 * noise
    return noise / max(1, param[0].numel()) ** 0.5


def _random_vae(cls, config: dict, *, seed: int, device, dtype, init_on_device: bool) -> nn.Module:
    vae = build_empty(cls, config)
    pinned = getattr(vae, "_keep_in_fp32_modules", None)
    device = torch.device(device)
    fill_random(
        vae,
        seed,
        device=device,
        init_on_device=init_on_device,
        draw=_random_tensor,
        dtype_for=lambda name: torch.float32 if keeps_fp32(name, pinned) else dtype,
    )
    return place(vae, device=device, dtype=dtype)


def random_video_vae(size: str, *, seed: int, device="cpu", dtype=torch.float32, init_on_device=False):
    """``AutoencoderKLMiniMaxH3`` at ``tiny`` or ``official`` sizes with seeded random weights."""
    from diffusers import AutoencoderKLMiniMaxH3

    config = _sizes(size, TINY_VIDEO_VAE, OFFICIAL_VIDEO_VAE)
    vae = _random_vae(
        AutoencoderKLMiniMaxH3, config, seed=seed, device=device, dtype=dtype, init_on_device=init_on_device
    )
    finish_loading(vae, f"{RANDOM_WEIGHTS}, {size} sizes", error=VAECheckpointError)
    return vae


def random_audio_vae(size: str, *, seed: int, device="cpu", init_on_device=False):
    """``AutoencoderKLMiniMaxH3Audio`` at ``tiny`` or ``official`` sizes with seeded random weights (float32)."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    config = {**_sizes(size, TINY_AUDIO_VAE, {}), **_IDENTITY_AUDIO_STATS}
    vae = _random_vae(
        AutoencoderKLMiniMaxH3Audio,
        config,
        seed=seed,
        device=device,
        dtype=torch.float32,
        init_on_device=init_on_device,
    )
    finish_loading(vae, f"{RANDOM_WEIGHTS}, {size} sizes", error=VAECheckpointError)
    return vae


def _sizes(size: str, tiny: dict, official: dict) -> dict:
    if size not in ("tiny", "official"):
        raise ValueError(f"VAE size must be 'tiny' or 'official', got {size!r}")
    return dict(tiny if size == "tiny" else official)
