"""`Chunk`: one step of a world session's video, as the LingBot pipeline makes it and the stream contract carries it.

A chunk is the unit a session advances by (4 latent frames for LingBot-World v2: 13 frames first, 16 later); its
frames are on the host, on every rank. Defined here, once, so that the stream service (which needs no torch) and the
pipeline share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass
class Chunk:
    index: int
    frames: np.ndarray  # uint8 [F, H, W, 3]
    measurement: dict[str, Any] = field(default_factory=dict)  # {index, frames, compute_seconds, phases: {...}}
    keys: tuple[str, ...] = ()  # the keys this chunk was generated with
    latents: torch.Tensor | None = None  # float32 [1, 16, 4, h, w] on the host when the session keeps them
