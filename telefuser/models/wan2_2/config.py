"""Wan 2.2's DiT config and its released variants, by name: T2V-A14B (two 14B experts switched at a boundary
timestep) and TI2V-5B (one 5B DiT over the 48-channel Wan 2.2 VAE), each with a CPU-sized `tiny` twin.

The DiT fields are `models.wan.config.WanConfig`'s (original ``config.json`` names; a diffusers config is mapped).
A `Wan22Release` adds what the release's sampling uses: the expert boundary, the flow shift, steps, guidance, the
VAE, frame rate and canvas. Sources: the Wan2.2 repository's ``wan/configs/wan_t2v_A14B.py`` and
``wan_ti2v_5B.py`` (read through the search index; values, not code).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from ..wan.config import WanConfig, WanConfigError

log = logging.getLogger(__name__)


class Wan22ConfigError(WanConfigError):
    """A config that cannot describe a Wan 2.2 DiT."""


@dataclass(frozen=True)
class Wan22Config(WanConfig):
    config_error = Wan22ConfigError
    model_label = "Wan 2.2"
    model_title = "Wan 2.2"
    logger = log

    @classmethod
    def tiny(cls, **overrides) -> Wan22Config:
        """CPU-sized, same structure: 4 heads x 16 channels, 2 layers, a 16-row prompt."""
        base = {"text_len": 16, "dim": 64, "ffn_dim": 128, "freq_dim": 32, "text_dim": 32, "num_heads": 4}
        return cls(**{**base, "num_layers": 2, **overrides})


@dataclass(frozen=True)
class Wan22Release:
    """One released variant: its DiT and how the release samples it."""

    name: str
    dit: Wan22Config
    experts: int  # 2: a high-noise expert for t >= boundary, a low-noise one below; 1: one DiT throughout
    boundary_ratio: float | None  # the switch at boundary_ratio * 1000 (None with one expert)
    flow_shift: float
    steps: int
    guidance: tuple[float, float]  # (high-noise expert, low-noise expert); equal with one expert
    vae: str  # "wan2.1" | "wan2.2" (`pipelines.wan.vae.VAE_CONFIGS`)
    fps: int
    size: tuple[int, int]  # (width, height) of the release's canvas
    frames: int
    takes_image: bool = False  # a first-frame image condition (TI2V-5B: text + image to video)

    @property
    def vae_scale(self) -> int:
        """Pixels per latent row or column (8 for Wan 2.1's VAE, 16 for Wan 2.2's)."""
        return 16 if self.vae == "wan2.2" else 8

    def tiny(self) -> Wan22Release:
        """The same variant at CPU size: a tiny DiT with the release's channels, a small canvas, a few steps."""
        dit = Wan22Config.tiny(in_dim=self.dit.in_dim, out_dim=self.dit.out_dim)
        return replace(self, dit=dit, steps=4, size=(8 * self.vae_scale, 4 * self.vae_scale), frames=9)


T2V_A14B = Wan22Release(
    name="t2v-a14b",
    dit=Wan22Config(),  # dim 5120, 40 heads x 128, 40 layers, FFN 13824, 16 latent channels
    experts=2,
    boundary_ratio=0.875,
    flow_shift=12.0,
    steps=40,
    guidance=(4.0, 3.0),
    vae="wan2.1",
    fps=16,
    size=(1280, 720),
    frames=81,
)
TI2V_5B = Wan22Release(
    name="ti2v-5b",
    dit=Wan22Config(model_type="ti2v", dim=3072, ffn_dim=14336, num_heads=24, num_layers=30, in_dim=48, out_dim=48),
    experts=1,
    boundary_ratio=None,
    flow_shift=5.0,
    steps=50,
    guidance=(5.0, 5.0),
    vae="wan2.2",
    fps=24,
    size=(1280, 704),
    frames=121,
    takes_image=True,
)
RELEASES = {release.name: release for release in (T2V_A14B, TI2V_5B)}


def release(name: str, size: str = "official") -> Wan22Release:
    """The variant `name` at `size` ("official" | "tiny")."""
    if name not in RELEASES:
        raise ValueError(f"unknown Wan 2.2 variant {name!r}; known: {', '.join(RELEASES)}")
    if size not in ("official", "tiny"):
        raise ValueError(f"size must be 'official' or 'tiny', got {size!r}")
    return RELEASES[name] if size == "official" else RELEASES[name].tiny()
