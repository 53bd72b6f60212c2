"""`LingBotWorldV2Config`: the causal DiT's architecture, with the field names of the official ``config.json``.

Defaults are the 14B v2 causal-fast values and the v2 streaming window (18 latent frames, the first 6 pinned). A
diffusers-format config is mapped onto these fields; Wan parts v2 lacks are refused by name. `tiny()` is for tests.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

from ..config_io import ReleasedConfig

log = logging.getLogger(__name__)

# Keys that fix weight shapes: a config.json without them cannot describe the checkpoint next to it.
REQUIRED_KEYS = ("in_dim", "dim", "ffn_dim", "num_heads", "num_layers")
# Keys only the diffusers-format transformer config carries (robbyant/...-diffusers, FastVideo exports).
DIFFUSERS_KEYS = ("in_channels", "num_attention_heads", "attention_head_dim", "out_channels")
# The diffusers keys that fix weight shapes (the others default to the same values in both layouts).
DIFFUSERS_REQUIRED_KEYS = ("in_channels", "num_attention_heads", "attention_head_dim", "ffn_dim", "num_layers")
# diffusers key -> ours, where only the name differs.
DIFFUSERS_RENAMES = {"in_channels": "in_dim", "out_channels": "out_dim", "num_attention_heads": "num_heads"}
# Keys both layouts spell alike.
SHARED_KEYS = (
    "patch_size",
    "text_dim",
    "freq_dim",
    "ffn_dim",
    "num_layers",
    "cross_attn_norm",
    "eps",
    "local_attn_size",
    "sink_size",
    "model_type",
    "text_len",
    "control_type",
)
# Wan-family parts a diffusers config can switch on and LingBot-World v2 does not have (their value must be null).
DIFFUSERS_ABSENT_PARTS = {
    "image_dim": "a CLIP image branch (Wan 2.1 I2V)",
    "added_kv_proj_dim": "image key/value projections in cross-attention (Wan 2.1 I2V)",
    "pos_embed_seq_len": "a learned position embedding (Wan FLF2V)",
}
ACROSS_HEADS_QK_NORM = "rms_norm_across_heads"  # diffusers' name for RMSNorm over all heads, the released Q/K norm

CAMERA_CHANNELS = 6  # Plucker-style rays: origin (3) + direction (3) per pixel
VAE_STRIDE_PIXELS = 64  # one latent pixel covers an 8x8 pixel block: 64 values per ray channel
MODULATION_PARAMS = 6  # shift, scale, gate for self-attention and for the FFN


class LingBotConfigError(ValueError):
    """A config that cannot describe a LingBot-World v2 causal DiT."""


@dataclass(frozen=True)
class LingBotWorldV2Config(ReleasedConfig):
    required_keys = REQUIRED_KEYS
    config_error = LingBotConfigError
    model_label = "LingBot"
    logger = log

    model_type: str = "i2v"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512  # text rows the model attends to: prompts are zero-padded to this length, as released
    in_dim: int = 36  # 16 noisy-latent + 4 first-frame mask + 16 image-latent channels
    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = 16
    num_heads: int = 40
    num_layers: int = 40
    local_attn_size: int = 18  # KV window in latent frames, sink included (-1: unbounded, not streamable)
    sink_size: int = 6  # first latent frames kept in the window forever
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    control_type: str = "cam"
    rope_theta: float = 10000.0  # not in config.json: Wan's rope_params base

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        positive = (
            "text_len",
            "in_dim",
            "dim",
            "ffn_dim",
            "freq_dim",
            "text_dim",
            "out_dim",
            "num_heads",
            "num_layers",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise LingBotConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if len(self.patch_size) != 3 or min(self.patch_size) <= 0:
            raise LingBotConfigError(f"patch_size must be three positive integers, got {self.patch_size}")
        if self.dim % self.num_heads:
            raise LingBotConfigError(f"dim {self.dim} does not split into {self.num_heads} heads")
        if self.head_dim % 2 or self.head_dim < 6:
            raise LingBotConfigError(f"head_dim {self.head_dim} must be even and >= 6 for the 3-axis rotary")
        if self.freq_dim % 2:
            raise LingBotConfigError(f"freq_dim must be even (cos | sin), got {self.freq_dim}")
        if not self.qk_norm:
            raise LingBotConfigError("qk_norm=False is not supported: every released LingBot checkpoint has Q/K norms")
        if self.control_type != "cam":
            raise LingBotConfigError(
                f"control_type {self.control_type!r} is not supported: LingBot-World v2 is the 6-channel camera model"
            )
        if self.local_attn_size != -1 and self.local_attn_size < 1:
            raise LingBotConfigError(f"local_attn_size must be -1 or positive, got {self.local_attn_size}")
        if self.sink_size < 0 or (self.local_attn_size != -1 and self.sink_size >= self.local_attn_size):
            raise LingBotConfigError(
                f"sink_size {self.sink_size} must be >= 0 and smaller than local_attn_size {self.local_attn_size}"
            )

    # -- derived sizes ------------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch_volume(self) -> int:
        return math.prod(self.patch_size)

    @property
    def camera_feature_dim(self) -> int:
        """Per-token camera features: 6 ray channels x 64 pixels of a VAE block x the patch (1536 for 1x2x2)."""
        return CAMERA_CHANNELS * VAE_STRIDE_PIXELS * self.patch_volume

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, payload: dict, *, source: str = "config") -> "LingBotWorldV2Config":
        """Reads the original keys as `ReleasedConfig.from_dict`; a diffusers-format config is mapped first."""
        if is_diffusers_config(payload):
            payload = original_keys_from_diffusers(payload, source=source)
        return super().from_dict(payload, source=source)

    def with_window(self, local_attn_size: int, sink_size: int) -> "LingBotWorldV2Config":
        return replace(self, local_attn_size=local_attn_size, sink_size=sink_size)

    @classmethod
    def tiny(cls, **overrides) -> "LingBotWorldV2Config":
        """CPU-sized, same structure: 4 heads x 16 channels, 2 layers, a 4-frame window with 1 sink frame (so the
        window rolls within three chunks of 1-2 latent frames)."""
        base = dict(
            text_len=8,
            dim=64,
            ffn_dim=128,
            freq_dim=32,
            text_dim=32,
            num_heads=4,
            num_layers=2,
            local_attn_size=4,
            sink_size=1,
        )
        return cls(**{**base, **overrides})


# -- the diffusers-format transformer config ------------------------------------------------------------------------
def is_diffusers_config(payload: dict) -> bool:
    return any(key in payload for key in DIFFUSERS_KEYS)


def original_keys_from_diffusers(payload: dict, *, source: str = "config") -> dict:
    """A diffusers-format transformer config in the original key names. Keys this DiT does not use
    (``rope_max_seq_len``, ``num_frames_per_block`` ...) are passed on, so `from_dict` reports them as ignored."""
    mixed = sorted(k for k in ("in_dim", "dim", "num_heads", "out_dim") if k in payload)
    if mixed:
        raise LingBotConfigError(f"{source} mixes diffusers-format keys with original ones ({', '.join(mixed)})")
    missing = [key for key in DIFFUSERS_REQUIRED_KEYS if key not in payload]
    if missing:
        raise LingBotConfigError(
            f"{source} is a diffusers-format transformer config missing required keys: {', '.join(missing)}"
        )
    present = [
        f"{key}={payload[key]!r}: {part}"
        for key, part in DIFFUSERS_ABSENT_PARTS.items()
        if payload.get(key) is not None
    ]
    if present:
        raise LingBotConfigError(
            f"{source} describes a Wan model with " + "; ".join(present) + ". LingBot-World v2 has none of these"
        )
    qk_norm = payload.get("qk_norm", ACROSS_HEADS_QK_NORM)
    if qk_norm != ACROSS_HEADS_QK_NORM:
        raise LingBotConfigError(
            f"{source} has qk_norm={qk_norm!r}; LingBot-World v2 normalises Q and K over all heads "
            f"({ACROSS_HEADS_QK_NORM!r})"
        )
    mapped = {"dim": int(payload["num_attention_heads"]) * int(payload["attention_head_dim"]), "qk_norm": True}
    mapped.update({ours: payload[theirs] for theirs, ours in DIFFUSERS_RENAMES.items() if theirs in payload})
    if mapped.get("out_dim") is None:  # diffusers: out_channels = out_channels or in_channels
        mapped["out_dim"] = payload["in_channels"]
    mapped.update({key: payload[key] for key in SHARED_KEYS if key in payload})
    handled = {*DIFFUSERS_RENAMES, *SHARED_KEYS, *DIFFUSERS_ABSENT_PARTS, "attention_head_dim", "qk_norm"}
    mapped.update({key: value for key, value in payload.items() if key not in handled})
    return mapped
