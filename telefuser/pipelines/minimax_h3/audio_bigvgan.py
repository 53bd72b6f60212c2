"""The MiniMax H3 audio VAE *decoder*: 32-channel latents at 40 Hz -> 32 kHz mono waveform (hop 800).

Architecture as published by public re-implementations of the released ``audio_vae`` (README.md has the
sources): de-normalize with the per-channel ``latents_mean`` / ``latents_std`` of ``audio_vae/config.json``, a 1x1
``dec_in_proj`` (32 -> 2048), then a BigVGAN generator: ``conv_pre`` (k7), upsampling stages (transposed conv,
rates 5,5,2,2,2,2,2 -> x800) each followed by the mean of three AMP residual blocks (kernels 3/7/11, dilations
1/3/5) with anti-aliased SnakeBeta activations, a final anti-aliased SnakeBeta, ``conv_post`` (k7, one channel,
no bias) and a clamp to [-1, 1]. Stereo is decoded as two mono batch rows. The checkpoint stores weight-norm
pairs (``weight_g`` / ``weight_v``), folded into plain weights at load.

Module names mirror the checkpoint keys (``dec_in_proj.*``, ``decoder.conv_pre``, ``decoder.ups.<i>.0``,
``decoder.resblocks.<j>.convs1.<k>``, ``...activations.<m>.act.alpha``, ...). Loading is strict: a key the
checkpoint has and this module lacks (or the reverse) is an error naming the keys, never a silent partial load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 32_000
HOP = 800
LATENT_CHANNELS = 32


@dataclass(frozen=True)
class AudioDecoderConfig:
    latent_channels: int = LATENT_CHANNELS
    latent_dim: int = 2048  # dec_in_proj output, the decoder's input width
    decoder_dim: int = 1024  # conv_pre output; halves at every upsampling stage
    decoder_rates: tuple[int, ...] = (5, 5, 2, 2, 2, 2, 2)
    decoder_kernel_sizes: tuple[int, ...] = (9, 9, 4, 4, 4, 4, 4)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    sampling_rate: int = SAMPLE_RATE
    latents_mean: tuple[float, ...] = field(default=(0.0,) * LATENT_CHANNELS)
    latents_std: tuple[float, ...] = field(default=(1.0,) * LATENT_CHANNELS)

    def __post_init__(self) -> None:
        if math.prod(self.decoder_rates) != self.sampling_rate // 40:
            raise ValueError(
                f"decoder rates {self.decoder_rates} give hop {math.prod(self.decoder_rates)}, "
                f"not {self.sampling_rate // 40} (40 latent frames per second)"
            )
        if len(self.decoder_rates) != len(self.decoder_kernel_sizes):
            raise ValueError("decoder_rates and decoder_kernel_sizes must have the same length")
        if len(self.latents_mean) != self.latent_channels or len(self.latents_std) != self.latent_channels:
            raise ValueError("latents_mean / latents_std must have one value per latent channel")
        if self.decoder_dim >> len(self.decoder_rates) < 1:
            raise ValueError(f"decoder_dim {self.decoder_dim} cannot halve {len(self.decoder_rates)} times")

    @property
    def hop(self) -> int:
        return math.prod(self.decoder_rates)

    @classmethod
    def tiny(cls) -> AudioDecoderConfig:
        """Same structure with few channels and three stages (x800), for CPU tests."""
        return cls(latent_dim=32, decoder_dim=32, decoder_rates=(8, 10, 10), decoder_kernel_sizes=(16, 20, 20))

    @classmethod
    def from_json(cls, path: str | Path) -> AudioDecoderConfig:
        """Read the fields this decoder needs from ``audio_vae/config.json``; absent ones keep their defaults."""
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        raw = raw.get("arch_config", raw)
        values = {}
        for name in cls.__dataclass_fields__:
            if name in raw and raw[name] is not None:
                value = raw[name]
                if isinstance(value, list):
                    value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
                values[name] = value
        if "latents_mean" not in values or "latents_std" not in values:
            raise ValueError(f"{path} declares no latents_mean / latents_std; cannot de-normalize H3 audio latents")
        return cls(**values)


def _kaiser_sinc_lowpass(cutoff: float, half_width: float, kernel_size: int) -> torch.Tensor:
    """Kaiser-windowed sinc low-pass filter [1, 1, K] (the alias-free filter BigVGAN uses)."""
    even = kernel_size % 2 == 0
    half = kernel_size // 2
    delta_f = 4 * half_width
    attenuation = 2.285 * (half - 1) * math.pi * delta_f + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel_size, beta=beta, periodic=False)
    time = (torch.arange(-half, half) + 0.5) if even else (torch.arange(kernel_size) - half)
    taps = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return (taps / taps.sum()).view(1, 1, kernel_size)


class SnakeBeta(nn.Module):
    """``x + sin^2(exp(alpha) x) / (exp(beta) + 1e-9)``, alpha and beta stored log-scale per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + torch.sin(x * alpha).pow(2) / (beta + 1e-9)


class UpSample1d(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int = 12) -> None:
        super().__init__()
        self.ratio = ratio
        self.pad = kernel_size // ratio - 1
        self.pad_left = self.pad * ratio + (kernel_size - ratio) // 2
        self.pad_right = self.pad * ratio + (kernel_size - ratio + 1) // 2
        self.register_buffer("filter", _kaiser_sinc_lowpass(0.5 / ratio, 0.6 / ratio, kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        x = self.ratio * F.conv_transpose1d(x, self.filter.expand(channels, -1, -1), stride=self.ratio, groups=channels)
        return x[..., self.pad_left : -self.pad_right]


class LowPassFilter1d(nn.Module):
    def __init__(self, cutoff: float, half_width: float, stride: int, kernel_size: int) -> None:
        super().__init__()
        self.pad_left = kernel_size // 2 - int(kernel_size % 2 == 0)
        self.pad_right = kernel_size // 2
        self.stride = stride
        self.register_buffer("filter", _kaiser_sinc_lowpass(cutoff, half_width, kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad_left, self.pad_right), mode="replicate")
        return F.conv1d(x, self.filter.expand(channels, -1, -1), stride=self.stride, groups=channels)


class DownSample1d(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int = 12) -> None:
        super().__init__()
        self.lowpass = LowPassFilter1d(0.5 / ratio, 0.6 / ratio, ratio, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lowpass(x)


class Activation1d(nn.Module):
    """Anti-aliased activation: 2x upsample, SnakeBeta, 2x downsample."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.act = SnakeBeta(channels)
        self.upsample = UpSample1d()
        self.downsample = DownSample1d()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x)))


class AMPBlock(nn.Module):
    """Per dilation: act -> dilated conv -> act -> conv, added to the input."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2)
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2) for _ in dilations
        )
        # One list, interleaved (before conv1, before conv2) per dilation: the checkpoint's ordering.
        self.activations = nn.ModuleList(Activation1d(channels) for _ in range(2 * len(dilations)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, (conv1, conv2) in enumerate(zip(self.convs1, self.convs2)):
            x = x + conv2(self.activations[2 * i + 1](conv1(self.activations[2 * i](x))))
        return x


class BigVGANGenerator(nn.Module):
    def __init__(self, config: AudioDecoderConfig) -> None:
        super().__init__()
        self.num_kernels = len(config.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(config.latent_dim, config.decoder_dim, 7, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        channels = config.decoder_dim
        for rate, kernel in zip(config.decoder_rates, config.decoder_kernel_sizes):
            # Nested one-element list: the checkpoint names these ``ups.<i>.0``.
            self.ups.append(
                nn.ModuleList([nn.ConvTranspose1d(channels, channels // 2, kernel, rate, padding=(kernel - rate) // 2)])
            )
            channels //= 2
            for k, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes):
                self.resblocks.append(AMPBlock(channels, k, tuple(dilations)))
        self.activation_post = Activation1d(channels)
        self.conv_post = nn.Conv1d(channels, 1, 7, padding=3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_pre(x)
        for stage, (up,) in enumerate(self.ups):
            x = up(x)
            blocks = self.resblocks[stage * self.num_kernels : (stage + 1) * self.num_kernels]
            x = sum(block(x) for block in blocks) / self.num_kernels
        return self.conv_post(self.activation_post(x)).clamp(-1.0, 1.0)


class MiniMaxH3AudioDecoder(nn.Module):
    """Normalized audio latents [N, 32, T] -> waveform [N, 1, T * 800] in [-1, 1], fp32."""

    def __init__(self, config: AudioDecoderConfig = AudioDecoderConfig()) -> None:
        super().__init__()
        self.config = config
        self.dec_in_proj = nn.Conv1d(config.latent_channels, config.latent_dim, 1)
        self.decoder = BigVGANGenerator(config)
        self.register_buffer("latents_mean", torch.tensor(config.latents_mean, dtype=torch.float32), persistent=False)
        self.register_buffer("latents_std", torch.tensor(config.latents_std, dtype=torch.float32), persistent=False)

    @torch.no_grad()
    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        z = latents.float() * self.latents_std[:, None] + self.latents_mean[:, None]
        return self.decoder(self.dec_in_proj(z))

    @classmethod
    def from_checkpoint(cls, folder: str | Path, *, device: str | torch.device = "cpu") -> MiniMaxH3AudioDecoder:
        """Load ``audio_vae/{config.json, model.safetensors}``; encoder tensors are ignored (decode only)."""
        from safetensors.torch import load_file

        folder = Path(folder)
        weights = folder / "model.safetensors"
        if not weights.is_file() or not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} must hold config.json and model.safetensors (the audio_vae folder)")
        decoder = cls(AudioDecoderConfig.from_json(folder / "config.json"))
        state = fold_weight_norm(load_file(str(weights), device="cpu"))
        state = {k: v for k, v in state.items() if k.startswith(("dec_in_proj.", "decoder."))}
        load_strict(decoder, state, what=f"audio VAE decoder from {weights}")
        return decoder.to(device=device, dtype=torch.float32).eval()


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace ``weight_g`` / ``weight_v`` pairs (torch weight_norm, dim=0) by ``weight = g * v / ||v||``."""
    folded: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".weight_g"):
            continue
        if name.endswith(".weight_v"):
            stem = name[: -len("weight_v")]
            g = state[stem + "weight_g"].float()
            v = tensor.float()
            norm = v.norm(p=2, dim=tuple(range(1, v.ndim)), keepdim=True)
            folded[stem + "weight"] = g * v / norm
        else:
            folded[name] = tensor
    return folded


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], *, what: str) -> None:
    """`load_state_dict` that explains a mismatch in terms of checkpoint keys."""
    expected = set(module.state_dict().keys())
    got = set(state.keys())
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        raise ValueError(
            f"{what}: checkpoint keys do not match this implementation "
            f"({len(missing)} missing, e.g. {missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]})"
        )
    shapes = [k for k in expected if tuple(module.state_dict()[k].shape) != tuple(state[k].shape)]
    if shapes:
        k = shapes[0]
        raise ValueError(
            f"{what}: {len(shapes)} tensors have other shapes, e.g. {k}: checkpoint {tuple(state[k].shape)}, "
            f"module {tuple(module.state_dict()[k].shape)}"
        )
    module.load_state_dict(state, strict=True)
