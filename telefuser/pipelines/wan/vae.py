"""Wan 2.1 VAE through diffusers' ``AutoencoderKLWan``: encode the reference image once, decode chunks as a stream.

`StreamEncoder` and `StreamDecoder` drive diffusers' frame-by-frame encoder and decoder with a cache they own, so
each chunk continues where the previous one stopped and the result equals a one-shot pass (tested). They rely on
diffusers internals, which `check_stream_internals` checks. Normalisation, streams and weights: this folder's README.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import torch
from packaging.specifiers import SpecifierSet

log = logging.getLogger(__name__)

TESTED_DIFFUSERS = ">=0.42.1,<0.43"  # the range pyproject pins; the private internals below were read there
# Cached forwards the streams call, and the arguments they pass.
_CACHED_FORWARDS = {
    "WanEncoder3d": ("feat_cache", "feat_idx"),
    "WanDecoder3d": ("feat_cache", "feat_idx", "first_chunk"),
}
_MODULE_CLASSES = ("WanCausalConv3d", "WanAttentionBlock")  # what vae_parallel rewraps
_MODEL_PARTS = ("encoder", "decoder", "quant_conv", "post_quant_conv")


class DiffusersVersionError(RuntimeError):
    """The installed diffusers lacks the private AutoencoderKLWan internals the VAE streams drive."""


def check_stream_internals(model=None) -> list[str]:
    """Raise `DiffusersVersionError` naming every private piece of diffusers' Wan VAE the streams need and the
    installed diffusers lacks (`model`: an ``AutoencoderKLWan`` instance, whose attributes are checked too). Returns
    warnings (also logged): a diffusers outside the tested range that has every piece may still behave otherwise."""
    import diffusers
    from diffusers.models.autoencoders import autoencoder_kl_wan as wan_vae

    version = getattr(diffusers, "__version__", "unknown")
    lacking = []
    for name, arguments in _CACHED_FORWARDS.items():
        cls = getattr(wan_vae, name, None)
        if cls is None:
            lacking.append(f"class {name}")
            continue
        parameters = inspect.signature(cls.forward).parameters
        lacking += [f"{name}.forward({arg}=...)" for arg in arguments if arg not in parameters]
    lacking += [f"class {name}" for name in _MODULE_CLASSES if not hasattr(wan_vae, name)]
    if model is not None:
        counts = getattr(model, "_cached_conv_counts", None)
        if not isinstance(counts, dict) or not {"encoder", "decoder"} <= set(counts):
            lacking.append("AutoencoderKLWan._cached_conv_counts['encoder'/'decoder']")
        lacking += [f"AutoencoderKLWan.{part}" for part in _MODEL_PARTS if not hasattr(model, part)]
    if lacking:
        raise DiffusersVersionError(
            f"diffusers {version} lacks what the Wan VAE streams drive: {', '.join(lacking)}. They use "
            f"AutoencoderKLWan's private internals as of diffusers {TESTED_DIFFUSERS}; install "
            f"'diffusers{TESTED_DIFFUSERS}'"
        )
    if not SpecifierSet(TESTED_DIFFUSERS).contains(version, prereleases=True):
        message = (
            f"diffusers {version} is outside the range the Wan VAE streams were tested with "
            f"({TESTED_DIFFUSERS}); the private AutoencoderKLWan internals they drive are present, but may "
            "behave otherwise"
        )
        log.warning(message)
        return [message]
    return []


# Wan 2.1 VAE architecture (diffusers' AutoencoderKLWan defaults, written out so a change there cannot move us).
OFFICIAL_VAE_CONFIG = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
}
# Same structure (and so the same frame arithmetic and receptive field), narrow channels: for CPU tests and demos.
TINY_VAE_CONFIG = dict(OFFICIAL_VAE_CONFIG, base_dim=8)
LATENT_CHANNELS = 16  # Wan 2.1's
# Wan 2.2's VAE (TI2V-5B): 48 latent channels, 16x spatial compression (a 2x2 pixel patch before the encoder),
# residual down/up blocks. Random weights only: its released latent statistics come with its diffusers config, so a
# random one normalises with zero mean and unit std.
WAN22_VAE_CONFIG = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "latents_mean": [0.0] * 48,
    "latents_std": [1.0] * 48,
}
VAE_CONFIGS = {
    ("wan2.1", "official"): OFFICIAL_VAE_CONFIG,
    ("wan2.1", "tiny"): TINY_VAE_CONFIG,
    ("wan2.2", "official"): WAN22_VAE_CONFIG,
    ("wan2.2", "tiny"): dict(WAN22_VAE_CONFIG, base_dim=8, decoder_base_dim=16),
}
LATENT_CHANNELS_OF = {"wan2.1": 16, "wan2.2": 48}


class WanVideoVAE:
    """The VAE plus its latent normalisation; fp32 by default (the reference runs the VAE in fp32)."""

    def __init__(self, model, *, description: str) -> None:
        check_stream_internals(model)
        self.model = model.eval().requires_grad_(False)
        self.description = description
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        config = model.config
        if int(config.z_dim) not in LATENT_CHANNELS_OF.values():
            raise ValueError(f"expected a Wan 2.1 (16-channel) or 2.2 (48-channel) VAE, got z_dim={config.z_dim}")
        self.latent_channels = int(config.z_dim)
        self.spatial_scale = int(getattr(config, "scale_factor_spatial", 8))
        self.mean = torch.tensor(config.latents_mean, dtype=torch.float32, device=self.device).view(1, -1, 1, 1, 1)
        self.inv_std = 1.0 / torch.tensor(config.latents_std, dtype=torch.float32, device=self.device).view(
            1, -1, 1, 1, 1
        )

    @classmethod
    def random(cls, size: str = "tiny", *, seed: int = 0, device="cpu", dtype=torch.float32, kind: str = "wan2.1"):
        """A seeded random VAE of `kind` ("wan2.1" | "wan2.2") at `size` ("tiny" | "official")."""
        from diffusers import AutoencoderKLWan

        if (kind, size) not in VAE_CONFIGS:
            raise ValueError(f"VAE kind and size must be one of {sorted(VAE_CONFIGS)}, got {(kind, size)}")
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)  # diffusers initialises from the global generator; restore it afterwards
        try:
            model = AutoencoderKLWan(**VAE_CONFIGS[kind, size])
        finally:
            torch.random.set_rng_state(generator_state)
        version = {"wan2.1": "Wan 2.1", "wan2.2": "Wan 2.2"}[kind]
        return cls(_place(model, device, dtype), description=f"random (no checkpoint), {size} {version} VAE")

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device="cpu", dtype=torch.float32) -> WanVideoVAE:
        """A diffusers-format ``vae/`` folder (config.json + safetensors) through `AutoencoderKLWan.from_pretrained`."""
        from diffusers import AutoencoderKLWan

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no diffusers VAE at {path}: config.json is missing")
        model = AutoencoderKLWan.from_pretrained(str(path), torch_dtype=dtype, local_files_only=True)
        return cls(model.to(device=device), description=f"{path} (Wan 2.1 VAE, diffusers format)")

    @classmethod
    def from_official(cls, path: str | Path, *, device="cpu", dtype=torch.float32, kind: str = "wan2.1"):
        """Load ``Wan2.1_VAE.pth`` (Wan's state dict) into ``AutoencoderKLWan``. Wan 2.2's ``Wan2.2_VAE.pth`` is
        refused: diffusers has no converter for it; its diffusers folder (``vae/``) loads with `from_pretrained`."""
        from diffusers import AutoencoderKLWan
        from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

        path = Path(path)
        if kind != "wan2.1":
            raise ValueError(
                f"{path}: only the Wan 2.1 VAE loads from the original release's file; load Wan 2.2's from a "
                "diffusers folder (vae/)"
            )
        if not path.is_file():
            raise FileNotFoundError(f"Wan VAE checkpoint not found: {path}")
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict) or "decoder.middle.0.residual.0.gamma" not in state:
            raise ValueError(f"{path} is not a Wan 2.1 VAE state dict (no decoder.middle.0.residual.0.gamma)")
        converted = convert_wan_vae_to_diffusers(state)
        model = AutoencoderKLWan(**OFFICIAL_VAE_CONFIG)
        _load_strict(model, converted, path)
        return cls(_place(model, device, dtype), description=f"{path} (Wan 2.1 VAE)")

    @property
    def conv_count(self) -> int:
        return int(self.model._cached_conv_counts["decoder"])

    @torch.no_grad()
    def encode_condition(self, image: torch.Tensor, latent_frames: int) -> torch.Tensor:
        """``[3, H, W]`` in [-1, 1] -> normalised latents ``[1, 16, latent_frames, H/8, W/8]`` (float32).

        The clip is the image followed by ``4 * (latent_frames - 1)`` black (zero) frames, as the reference encodes it.
        """
        if latent_frames < 1:
            raise ValueError(f"latent_frames must be >= 1, got {latent_frames}")
        channels, height, width = image.shape
        video = torch.zeros(
            1, channels, 1 + 4 * (latent_frames - 1), height, width, dtype=self.dtype, device=self.device
        )
        video[:, :, 0] = image.to(device=self.device, dtype=self.dtype)
        mu = self.model.encode(video).latent_dist.mode().float()
        return (mu - self.mean) * self.inv_std

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        return latents.float() / self.inv_std + self.mean

    def stream_encoder(self, image: torch.Tensor, *, reuse_steady_state: bool = True) -> StreamEncoder:
        """A condition stream for `image` (``[3, H, W]`` in [-1, 1]): ``next(n)`` gives the next n latent frames."""
        return StreamEncoder(self, image, reuse_steady_state=reuse_steady_state)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, sharding=None) -> torch.Tensor:
        """Normalised ``[1, C, F, h, w]`` -> pixels ``[1, 3, 1 + 4 (F - 1), H, W]`` in [-1, 1], in one pass (this
        rank's rows with a `HeightShardedDecoder`, Wan 2.1 only: Wan 2.2's decoder ends in a pixel unpatchify)."""
        if sharding is None:
            z = self.denormalize(latents).to(device=self.device, dtype=self.dtype)
            return self.model.decode(z).sample.clamp_(-1.0, 1.0)
        if getattr(self.model.config, "patch_size", None):
            raise ValueError("height-sharded decode runs the Wan 2.1 VAE only; decode a Wan 2.2 VAE on one rank")
        stream = StreamDecoder(self, sharding)
        try:
            return stream.decode(latents)
        finally:
            stream.close()

    def stream_decoder(self, sharding=None) -> StreamDecoder:
        """A fresh decoding stream (one per session). `sharding`: a `HeightShardedDecoder` for multi-rank decode."""
        return StreamDecoder(self, sharding)


class StreamEncoder:
    """Encodes the image-then-black-frames clip in latent-frame chunks with a causal cache it owns.

    After enough black frames the image has left the encoder's causal receptive field: a black group then leaves
    the cache exactly as it found it (29 latent frames in, with the Wan 2.1 architecture), and every later group
    encodes to the same values. The stream notices that fixed point and reuses that encoding instead of running the
    encoder again (`reuse_steady_state`; `encoder_calls` counts the runs)."""

    def __init__(self, vae: WanVideoVAE, image: torch.Tensor, *, reuse_steady_state: bool = True) -> None:
        self.vae = vae
        self._image = image.to(device=vae.device, dtype=vae.dtype)
        self._cache: list | None = [None] * int(vae.model._cached_conv_counts["encoder"])
        self._first = True
        self._reuse = reuse_steady_state
        self._steady: torch.Tensor | None = None  # the black group's encoding once the cache stopped changing
        self.encoder_calls = 0

    @torch.no_grad()
    def next(self, latent_frames: int) -> torch.Tensor:
        """The next `latent_frames` normalised latents ``[1, 16, latent_frames, H/8, W/8]`` (float32)."""
        if self._cache is None:
            raise RuntimeError("this encode stream is closed")
        if latent_frames < 1:
            raise ValueError(f"latent_frames must be >= 1, got {latent_frames}")
        vae, (channels, height, width) = self.vae, self._image.shape
        groups = []
        for _ in range(latent_frames):
            if self._steady is not None:
                groups.append(self._steady)
                continue
            black = not self._first
            if black:
                group = torch.zeros(1, channels, 4, height, width, device=vae.device, dtype=vae.dtype)
            else:  # the causal first latent frame is the image alone
                group = self._image.view(1, channels, 1, height, width)
                self._first = False
            before = list(self._cache)
            groups.append(vae.model.encoder(group, feat_cache=self._cache, feat_idx=[0]))
            self.encoder_calls += 1
            if self._reuse and black and _same_cache(before, self._cache):
                self._steady = groups[-1]
        moments = vae.model.quant_conv(torch.cat(groups, dim=2))
        mu = moments[:, : moments.shape[1] // 2].float()  # the posterior mean (mode), as `latent_dist.mode()`
        return (mu - vae.mean) * vae.inv_std

    def close(self) -> None:
        self._cache = None
        self._image = None


def _same_cache(before: list, after: list) -> bool:
    """Whether a group left every causal-conv cache entry as it found it (tensors bit for bit; markers by value)."""
    for a, b in zip(before, after):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or not torch.equal(a, b):
                return False
        elif a is not b and a != b:
            return False
    return True


class StreamDecoder:
    """Decodes a session's chunks in order with a causal cache it owns; `close()` drops the cache."""

    def __init__(self, vae: WanVideoVAE, sharding=None) -> None:
        self.vae = vae
        self.sharding = sharding
        self._cache: list | None = [None] * vae.conv_count
        self._first = True

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised ``[1, 16, F, h, w]`` -> pixels ``[1, 3, T, H, W]`` in [-1, 1] (this rank's rows when sharded).

        T is ``1 + 4 (F - 1)`` for the first call of the stream and ``4 F`` afterwards.
        """
        if self._cache is None:
            raise RuntimeError("this decode stream is closed")
        vae = self.vae
        z = vae.denormalize(latents).to(device=vae.device, dtype=vae.dtype)
        x = vae.model.post_quant_conv(z)  # 1x1x1: per frame and per pixel, so chunk-wise and band-wise is exact
        decoder = vae.model.decoder
        if self.sharding is not None:
            x = self.sharding.local_rows(x)
            decoder = self.sharding.decoder
        frames = []
        for i in range(x.shape[2]):
            frames.append(decoder(x[:, :, i : i + 1], feat_cache=self._cache, feat_idx=[0], first_chunk=self._first))
            self._first = False
        return torch.cat(frames, dim=2).clamp_(-1.0, 1.0)

    def close(self) -> None:
        self._cache = None


def to_uint8_frames(pixels: torch.Tensor) -> torch.Tensor:
    """``[1, 3, T, H, W]`` in [-1, 1] -> uint8 ``[T, H, W, 3]`` on the same device (rounded, not truncated)."""
    return ((pixels[0].float() + 1.0) * 127.5).round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 3, 0).contiguous()


def _place(model, device, dtype):
    model = model.to(device=device)
    # diffusers warns on any dtype argument to .to(); only pass one when it changes something
    return model if dtype == torch.float32 else model.to(dtype=dtype)


def _load_strict(model, state: dict, source: Path) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mis_shaped = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    if missing or unexpected or mis_shaped:
        raise ValueError(
            f"{source}: cannot map onto AutoencoderKLWan (Wan 2.1): {len(missing)} missing "
            f"{missing[:5]}, {len(unexpected)} unexpected {unexpected[:5]}, {len(mis_shaped)} mis-shaped "
            f"{[(k, tuple(state[k].shape), tuple(expected[k].shape)) for k in mis_shaped[:3]]}"
        )
    model.load_state_dict(state, strict=True)
