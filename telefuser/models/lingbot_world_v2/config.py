"""`LingBotWorldV2Config`: the causal DiT's architecture, with the field names of the official ``config.json``.

The Wan fields, their checks and the diffusers-format map are `models.wan.config.WanConfig`'s; this adds the camera
control and the streaming window. Defaults are the 14B v2 causal-fast values and the v2 streaming window (18 latent
frames, the first 6 pinned). `tiny()` is for tests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from ..wan.config import SHARED_KEYS, WanConfig, WanConfigError

log = logging.getLogger(__name__)

CAMERA_CHANNELS = 6  # Plucker-style rays: origin (3) + direction (3) per pixel
VAE_STRIDE_PIXELS = 64  # one latent pixel covers an 8x8 pixel block: 64 values per ray channel


class LingBotConfigError(WanConfigError):
    """A config that cannot describe a LingBot-World v2 causal DiT."""


@dataclass(frozen=True)
class LingBotWorldV2Config(WanConfig):
    config_error = LingBotConfigError
    model_label = "LingBot"
    model_title = "LingBot-World v2"
    logger = log
    shared_keys = (*SHARED_KEYS, "local_attn_size", "sink_size", "control_type")

    model_type: str = "i2v"
    in_dim: int = 36  # 16 noisy-latent + 4 first-frame mask + 16 image-latent channels
    local_attn_size: int = 18  # KV window in latent frames, sink included (-1: unbounded, not streamable)
    sink_size: int = 6  # first latent frames kept in the window forever
    control_type: str = "cam"

    def __post_init__(self) -> None:
        super().__post_init__()
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

    @property
    def camera_feature_dim(self) -> int:
        """Per-token camera features: 6 ray channels x 64 pixels of a VAE block x the patch (1536 for 1x2x2)."""
        return CAMERA_CHANNELS * VAE_STRIDE_PIXELS * self.patch_volume

    def with_window(self, local_attn_size: int, sink_size: int) -> LingBotWorldV2Config:
        return replace(self, local_attn_size=local_attn_size, sink_size=sink_size)

    @classmethod
    def tiny(cls, **overrides) -> LingBotWorldV2Config:
        """CPU-sized, same structure: 4 heads x 16 channels, 2 layers, a 4-frame window with 1 sink frame (so the
        window rolls within three chunks of 1-2 latent frames)."""
        base = {
            "text_len": 8,
            "dim": 64,
            "ffn_dim": 128,
            "freq_dim": 32,
            "text_dim": 32,
            "num_heads": 4,
            "num_layers": 2,
            "local_attn_size": 4,
            "sink_size": 1,
        }
        return cls(**{**base, **overrides})

    @classmethod
    def tiny_session(cls, **overrides) -> LingBotWorldV2Config:
        """`tiny` with the window the tiny pipeline session runs (`--config tiny`): 10 frames with 2 sink frames, so
        4-latent chunks fit and the window rolls from chunk 3 on."""
        return cls.tiny(**{"local_attn_size": 10, "sink_size": 2, **overrides})
