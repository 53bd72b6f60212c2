"""`MiniMaxH3Config`: the DiT's architecture, with the field names and defaults of the released ``config.json``."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

from ..config_io import ReleasedConfig

log = logging.getLogger(__name__)

# Keys a released config.json must carry: they fix every weight shape. The others have released defaults.
REQUIRED_KEYS = (
    "hidden_size",
    "num_layers",
    "token_refiner_num_layers",
    "num_attention_heads",
    "attention_head_dim",
    "ffn_hidden_size",
    "latents_dim",
    "audio_latents_dim",
    "patch_size",
    "text_dim",
    "timestep_input_dim",
    "time_embed_hidden_size",
    "time_embed_dim",
    "rope_inv_freq_len",
)

# AdaLN outputs per token: 6 (shift, scale, gate for attention and MLP) per modality (video, text, audio).
ADALN_PARAMS_PER_MODALITY = 6
ADALN_MODALITIES = 3
FINAL_ADALN_PARAMS = 2  # shift, scale

# diffusers' `MiniMaxH3Transformer3DModel` argument -> this config's field (the released config.json name)
DIFFUSERS_FIELDS = {
    "num_attention_heads": "num_attention_heads",
    "attention_head_dim": "attention_head_dim",
    "hidden_size": "hidden_size",
    "num_layers": "num_layers",
    "num_refiner_layers": "token_refiner_num_layers",
    "ffn_dim": "ffn_hidden_size",
    "in_channels": "latents_dim",
    "audio_in_channels": "audio_latents_dim",
    "patch_size": "patch_size",
    "text_dim": "text_dim",
    "freq_dim": "timestep_input_dim",
    "time_embed_hidden_dim": "time_embed_hidden_size",
    "time_embed_dim": "time_embed_dim",
    "rope_freq_dim": "rope_inv_freq_len",
    "rope_theta": "rope_theta",
    "norm_eps": "norm_eps",
    "qk_norm_eps": "qk_norm_eps",
    "final_norm_eps": "final_norm_eps",
}


class MiniMaxH3ConfigError(ValueError):
    """A config that cannot describe a MiniMax H3 DiT (missing keys, inconsistent sizes)."""


@dataclass(frozen=True)
class MiniMaxH3Config(ReleasedConfig):
    required_keys = REQUIRED_KEYS
    config_error = MiniMaxH3ConfigError
    model_label = "MiniMax H3"
    logger = log

    hidden_size: int = 5376
    num_layers: int = 50
    token_refiner_num_layers: int = 2
    num_attention_heads: int = 56
    attention_head_dim: int = 128
    ffn_hidden_size: int = 14336
    latents_dim: int = 24
    audio_latents_dim: int = 32
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_dim: int = 5120
    timestep_input_dim: int = 256
    time_embed_hidden_size: int = 5376
    time_embed_dim: int = 2688
    adaln_out_features: int | None = None  # derived (18 * hidden_size) when absent; checked when present
    final_adaln_out_features: int | None = None  # derived (2 * hidden_size)
    rope_inv_freq_len: int = 16
    rope_theta: float = 10000.0  # not in the released config.json; the released rope.inv_freq table solves to 1e4
    norm_eps: float = 1e-5
    qk_norm_eps: float = 1e-5
    final_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        self._derive("adaln_out_features", ADALN_PARAMS_PER_MODALITY * ADALN_MODALITIES * self.hidden_size)
        self._derive("final_adaln_out_features", FINAL_ADALN_PARAMS * self.hidden_size)
        positive = (
            "hidden_size",
            "num_layers",
            "num_attention_heads",
            "attention_head_dim",
            "ffn_hidden_size",
            "latents_dim",
            "audio_latents_dim",
            "text_dim",
            "timestep_input_dim",
            "time_embed_hidden_size",
            "time_embed_dim",
            "rope_inv_freq_len",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise MiniMaxH3ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.token_refiner_num_layers < 0:
            raise MiniMaxH3ConfigError(f"token_refiner_num_layers must be >= 0, got {self.token_refiner_num_layers}")
        if len(self.patch_size) != 3 or min(self.patch_size) <= 0:
            raise MiniMaxH3ConfigError(f"patch_size must be three positive integers, got {self.patch_size}")
        if self.timestep_input_dim % 2:
            raise MiniMaxH3ConfigError(f"timestep_input_dim must be even (cos | sin), got {self.timestep_input_dim}")
        if self.rotary_dim > self.attention_head_dim:
            raise MiniMaxH3ConfigError(
                f"the 3-axis rotary needs 6 * rope_inv_freq_len = {self.rotary_dim} channels but a head has only "
                f"{self.attention_head_dim}"
            )

    def _derive(self, name: str, expected: int) -> None:
        value = getattr(self, name)
        if value is None:
            object.__setattr__(self, name, expected)
        elif value != expected:
            raise MiniMaxH3ConfigError(f"{name}={value} does not match the architecture (expected {expected})")

    # -- derived sizes ------------------------------------------------------------------------------------------
    @property
    def inner_dim(self) -> int:
        """Attention width; 7168 in the release, larger than hidden_size."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def rotary_dim(self) -> int:
        """Rotated channels per head: 3 axes x rope_inv_freq_len frequencies, duplicated (NeoX halves)."""
        return 6 * self.rope_inv_freq_len

    @property
    def video_patch_dim(self) -> int:
        return self.latents_dim * math.prod(self.patch_size)

    # -- construction (from_dict / from_json / to_dict: ReleasedConfig) ------------------------------------------
    @classmethod
    def from_diffusers_dict(cls, payload: dict, *, source: str = "config") -> "MiniMaxH3Config":
        """A diffusers ``transformer/config.json`` (`MiniMaxH3Transformer3DModel`); absent fields take diffusers'
        defaults, which are the released values (this class's defaults)."""
        unknown = sorted(k for k in payload if k not in DIFFUSERS_FIELDS and not k.startswith("_"))
        if unknown:
            log.info("%s: ignoring keys this DiT does not use: %s", source, ", ".join(unknown))
        return cls(**{DIFFUSERS_FIELDS[k]: v for k, v in payload.items() if k in DIFFUSERS_FIELDS})

    def to_diffusers_dict(self) -> dict:
        """The `MiniMaxH3Transformer3DModel` arguments of this architecture."""
        mine = self.to_dict()
        return {theirs: mine[ours] for theirs, ours in DIFFUSERS_FIELDS.items()}

    @classmethod
    def tiny(cls, **overrides) -> "MiniMaxH3Config":
        """A CPU-sized config with the released structure: 8 heads x 16 channels (12 rotated), inner 128 != hidden."""
        base = cls(
            hidden_size=64,
            num_layers=2,
            token_refiner_num_layers=1,
            num_attention_heads=8,
            attention_head_dim=16,
            ffn_hidden_size=128,
            text_dim=32,
            timestep_input_dim=32,
            time_embed_hidden_size=64,
            time_embed_dim=32,
            rope_inv_freq_len=2,
        )
        if not overrides:
            return base
        overrides.setdefault("adaln_out_features", None)
        overrides.setdefault("final_adaln_out_features", None)
        return replace(base, **overrides)
