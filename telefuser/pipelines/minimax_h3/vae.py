"""Latents -> pixels and waveform for MiniMax H3.

Video: the official f16/t4/d24 VAE decodes with a ViT decoder (``AutoencoderKLLegacy``, clip length 17, token drop
3, per-channel latent mean/std) that is not public as a library class, so this build has no faithful video
decoder. `VideoDecoderStandIn` is a documented stand-in with the right shapes only: a fixed 24 -> 3 projection and
trilinear upsampling (16x spatial, ``5n + 2`` latent frames -> ``17n + 5`` frames). It refuses an official
checkpoint unless the caller explicitly accepts meaningless frames (useful to time the DiT with real weights).

Audio: the official decoder architecture is public (see `audio_bigvgan`), so an ``audio_vae`` checkpoint is
decoded faithfully by `MiniMaxH3AudioDecoder`. Without a checkpoint, `AudioDecoderStandIn` gives the right shape
cheaply (fixed 32 -> 1 projection, linear upsampling by 800).

Both stand-ins are deterministic closed-form functions (no random state, no weights to load).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .audio_bigvgan import MiniMaxH3AudioDecoder
from .shapes import (
    AUDIO_CHANNELS,
    AUDIO_HOP,
    AUDIO_LATENT_CHANNELS,
    VAE_SPATIAL,
    VIDEO_LATENT_CHANNELS,
    frame_count_from_latent_t,
)

OFFICIAL_VIDEO_VAE_REFUSAL = (
    "this build cannot decode the official MiniMax H3 VAE faithfully: the f16/t4/d24 video decoder is a ViT "
    "decoder (AutoencoderKLLegacy) that is not implemented here, and the stand-in would turn real latents into "
    "meaningless frames. Run without a video VAE checkpoint, or pass allow_standin_video_vae=True "
    "(--standin-video-vae) to time the rest of the pipeline knowing the frames are not meaningful."
)


def _cosine_projection(out_channels: int, in_channels: int) -> torch.Tensor:
    """A fixed, well-conditioned [out, in] mixing matrix (DCT-II rows), identical on every machine."""
    k = torch.arange(in_channels, dtype=torch.float64)
    rows = [torch.cos(math.pi * (c + 1) * (k + 0.5) / in_channels) for c in range(out_channels)]
    return (torch.stack(rows) * math.sqrt(2.0 / in_channels)).float()


class VideoDecoderStandIn(nn.Module):
    """[B, 24, T, h, w] latents -> [B, 3, F, 16h, 16w] in [-1, 1], F = 17n + 5 for T = 5n + 2. Shapes only."""

    faithful = False

    def __init__(self, description: str = "stand-in video decoder (fixed projection + upsampling; no weights)") -> None:
        super().__init__()
        self.description = description
        self.register_buffer("projection", _cosine_projection(3, VIDEO_LATENT_CHANNELS), persistent=False)

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> VideoDecoderStandIn:
        raise NotImplementedError(f"{OFFICIAL_VIDEO_VAE_REFUSAL} (checkpoint: {path})")

    @torch.no_grad()
    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        if latents.ndim != 5 or latents.shape[1] != VIDEO_LATENT_CHANNELS:
            raise ValueError(f"video latents must be [B, {VIDEO_LATENT_CHANNELS}, T, h, w], got {tuple(latents.shape)}")
        _, _, t, h, w = latents.shape
        frames = frame_count_from_latent_t(t)
        rgb = torch.einsum("oc,bcthw->bothw", self.projection.to(latents.device), latents.float())
        rgb = F.interpolate(rgb, size=(frames, h * VAE_SPATIAL, w * VAE_SPATIAL), mode="trilinear", align_corners=True)
        return torch.tanh(rgb)


class AudioDecoderStandIn(nn.Module):
    """Normalized audio latents [N, 32, T] -> [N, 1, T * 800] in [-0.5, 0.5]. Shapes only."""

    faithful = False

    def __init__(self) -> None:
        super().__init__()
        self.description = "stand-in audio decoder (fixed projection + linear upsampling; no weights)"
        self.register_buffer("projection", _cosine_projection(1, AUDIO_LATENT_CHANNELS), persistent=False)

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> AudioDecoderStandIn:
        raise NotImplementedError(
            "the audio stand-in never loads weights; an official audio_vae folder is decoded by "
            f"MiniMaxH3AudioDecoder (load_audio_decoder does this): {path}"
        )

    @torch.no_grad()
    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        mono = torch.einsum("oc,nct->not", self.projection.to(latents.device), latents.float())
        wave = F.interpolate(mono, size=latents.shape[-1] * AUDIO_HOP, mode="linear", align_corners=True)
        return 0.5 * torch.tanh(wave)


def load_video_decoder(checkpoint: str | Path | None, *, allow_standin: bool = False) -> VideoDecoderStandIn:
    """The video decoder for `checkpoint` (a ``video_vae`` folder) or the stand-in when there is none."""
    if checkpoint is None:
        return VideoDecoderStandIn()
    if not allow_standin:
        raise NotImplementedError(f"{OFFICIAL_VIDEO_VAE_REFUSAL} (checkpoint: {checkpoint})")
    return VideoDecoderStandIn(
        description=f"STAND-IN video decoder although {checkpoint} was given: frames are NOT meaningful"
    )


def load_audio_decoder(
    checkpoint: str | Path | None, *, device: str | torch.device = "cpu"
) -> MiniMaxH3AudioDecoder | AudioDecoderStandIn:
    """The faithful decoder from an ``audio_vae`` folder, or the stand-in when there is none."""
    if checkpoint is None:
        return AudioDecoderStandIn().to(device)
    decoder = MiniMaxH3AudioDecoder.from_checkpoint(checkpoint, device=device)
    decoder.description = f"MiniMax H3 audio VAE decoder from {checkpoint}"
    return decoder


def split_stereo_tokens(audio_tokens: torch.Tensor) -> torch.Tensor:
    """DiT audio tokens [B, 32, 2T] (left channel's T tokens, then right's) -> mono latents [B * 2, 32, T]."""
    b, c, n = audio_tokens.shape
    if n % AUDIO_CHANNELS:
        raise ValueError(f"audio token count {n} is not a multiple of {AUDIO_CHANNELS} channels")
    t = n // AUDIO_CHANNELS
    return audio_tokens.reshape(b, c, AUDIO_CHANNELS, t).permute(0, 2, 1, 3).reshape(b * AUDIO_CHANNELS, c, t)


def decode_audio(decoder: nn.Module, audio_tokens: torch.Tensor) -> torch.Tensor:
    """DiT audio tokens [B, 32, 2T] -> stereo waveform [B, 2, T * 800], fp32."""
    b = audio_tokens.shape[0]
    wave = decoder(split_stereo_tokens(audio_tokens.float()))
    return wave.reshape(b, AUDIO_CHANNELS, -1)
