"""`WanConfig`: the Wan 2.x DiT's architecture in the field names of the original ``config.json``, and the map from
diffusers' ``WanTransformer3DModel`` config onto them.

A model of the family (LingBot-World v2, Wan 2.2) subclasses it with its own defaults and fields, its error class and
its label; the checks and the diffusers map are shared. Wan parts a model lacks are refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..config_io import ReleasedConfig

# Keys that fix weight shapes: a config.json without them cannot describe the checkpoint next to it.
REQUIRED_KEYS = ("in_dim", "dim", "ffn_dim", "num_heads", "num_layers")
# Keys only the diffusers-format transformer config carries.
DIFFUSERS_KEYS = ("in_channels", "num_attention_heads", "attention_head_dim", "out_channels")
# The diffusers keys that fix weight shapes (the others default to the same values in both layouts).
DIFFUSERS_REQUIRED_KEYS = ("in_channels", "num_attention_heads", "attention_head_dim", "ffn_dim", "num_layers")
# diffusers key -> ours, where only the name differs.
DIFFUSERS_RENAMES = {"in_channels": "in_dim", "out_channels": "out_dim", "num_attention_heads": "num_heads"}
# Keys both layouts spell alike (a subclass adds its own with `shared_keys`).
SHARED_KEYS = (
    "patch_size",
    "text_dim",
    "freq_dim",
    "ffn_dim",
    "num_layers",
    "cross_attn_norm",
    "eps",
    "model_type",
    "text_len",
)
# Wan-family parts a diffusers config can switch on that the DiTs here do not have (their value must be null).
DIFFUSERS_ABSENT_PARTS = {
    "image_dim": "a CLIP image branch (Wan 2.1 I2V)",
    "added_kv_proj_dim": "image key/value projections in cross-attention (Wan 2.1 I2V)",
    "pos_embed_seq_len": "a learned position embedding (Wan FLF2V)",
}
ACROSS_HEADS_QK_NORM = "rms_norm_across_heads"  # diffusers' name for RMSNorm over all heads, the released Q/K norm
MODULATION_PARAMS = 6  # shift, scale, gate for self-attention and for the FFN


class WanConfigError(ValueError):
    """A config that cannot describe a Wan DiT."""


@dataclass(frozen=True)
class WanConfig(ReleasedConfig):
    """The fields every Wan 2.x DiT has; the defaults are the 14B ones (Wan 2.1 / 2.2 A14B)."""

    required_keys: ClassVar[tuple[str, ...]] = REQUIRED_KEYS
    config_error: ClassVar[type[ValueError]] = WanConfigError
    model_label: ClassVar[str] = "Wan"
    model_title: ClassVar[str] = "Wan"  # the model's name in refusals of a diffusers config
    shared_keys: ClassVar[tuple[str, ...]] = SHARED_KEYS

    model_type: str = "t2v"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512  # text rows the model attends to: prompts are zero-padded to this length, as released
    in_dim: int = 16
    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = 16
    num_heads: int = 40
    num_layers: int = 40
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    rope_theta: float = 10000.0  # not in config.json: Wan's rope_params base

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        error = self.config_error
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
                raise error(f"{name} must be positive, got {getattr(self, name)}")
        if len(self.patch_size) != 3 or min(self.patch_size) <= 0:
            raise error(f"patch_size must be three positive integers, got {self.patch_size}")
        if self.dim % self.num_heads:
            raise error(f"dim {self.dim} does not split into {self.num_heads} heads")
        if self.head_dim % 2 or self.head_dim < 6:
            raise error(f"head_dim {self.head_dim} must be even and >= 6 for the 3-axis rotary")
        if self.freq_dim % 2:
            raise error(f"freq_dim must be even (cos | sin), got {self.freq_dim}")
        if not self.qk_norm:
            raise error(f"qk_norm=False is not supported: every released {self.model_label} checkpoint has Q/K norms")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch_volume(self) -> int:
        return math.prod(self.patch_size)

    @classmethod
    def from_dict(cls, payload: dict, *, source: str = "config"):
        """Reads the original keys as `ReleasedConfig.from_dict`; a diffusers-format config is mapped first."""
        if is_diffusers_config(payload):
            payload = original_keys_from_diffusers(
                payload, source=source, error=cls.config_error, title=cls.model_title, shared_keys=cls.shared_keys
            )
        return super().from_dict(payload, source=source)


def is_diffusers_config(payload: dict) -> bool:
    return any(key in payload for key in DIFFUSERS_KEYS)


def original_keys_from_diffusers(
    payload: dict,
    *,
    source: str = "config",
    error: type[ValueError] = WanConfigError,
    title: str = "Wan",
    shared_keys: tuple[str, ...] = SHARED_KEYS,
) -> dict:
    """A diffusers-format transformer config in the original key names. Keys the DiT does not use
    (``rope_max_seq_len`` ...) are passed on, so `from_dict` reports them as ignored."""
    mixed = sorted(k for k in ("in_dim", "dim", "num_heads", "out_dim") if k in payload)
    if mixed:
        raise error(f"{source} mixes diffusers-format keys with original ones ({', '.join(mixed)})")
    missing = [key for key in DIFFUSERS_REQUIRED_KEYS if key not in payload]
    if missing:
        raise error(f"{source} is a diffusers-format transformer config missing required keys: {', '.join(missing)}")
    present = [
        f"{key}={payload[key]!r}: {part}"
        for key, part in DIFFUSERS_ABSENT_PARTS.items()
        if payload.get(key) is not None
    ]
    if present:
        raise error(f"{source} describes a Wan model with " + "; ".join(present) + f". {title} has none of these")
    qk_norm = payload.get("qk_norm", ACROSS_HEADS_QK_NORM)
    if qk_norm != ACROSS_HEADS_QK_NORM:
        raise error(
            f"{source} has qk_norm={qk_norm!r}; {title} normalises Q and K over all heads ({ACROSS_HEADS_QK_NORM!r})"
        )
    mapped = {"dim": int(payload["num_attention_heads"]) * int(payload["attention_head_dim"]), "qk_norm": True}
    mapped.update({ours: payload[theirs] for theirs, ours in DIFFUSERS_RENAMES.items() if theirs in payload})
    if mapped.get("out_dim") is None:  # diffusers: out_channels = out_channels or in_channels
        mapped["out_dim"] = payload["in_channels"]
    mapped.update({key: payload[key] for key in shared_keys if key in payload})
    handled = {*DIFFUSERS_RENAMES, *shared_keys, *DIFFUSERS_ABSENT_PARTS, "attention_head_dim", "qk_norm"}
    mapped.update({key: value for key, value in payload.items() if key not in handled})
    return mapped
