"""The seam between held keys and the DiT's camera conditioning; the geometry itself lives with the model.

A session's `CameraTrack` owns its accumulated camera pose and gives the DiT that chunk's camera features:
`LingBotCameraTrack` builds them with `telefuser.models.lingbot_world_v2.camera`, `NoCamera` gives None.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class CameraGeometry:
    width: int
    height: int
    latent_width: int
    latent_height: int
    chunk_latent_frames: int
    fps: float

    def as_dict(self) -> dict:
        return asdict(self)


class CameraTrack(Protocol):
    def features(self, keys: tuple[str, ...], chunk_index: int) -> torch.Tensor | None:
        """Camera features for chunk `chunk_index` (``[1, C, F_chunk, h, w]`` on the session's device) or None."""
        ...

    def close(self) -> None: ...


# factory(geometry, device, dtype) -> a fresh track for one session
CameraFactory = Callable[[CameraGeometry, torch.device, torch.dtype], CameraTrack]


class NoCamera:
    """No camera conditioning: the DiT gets None and keys only show up in the measurements."""

    description = "none (keys are recorded but do not condition the DiT)"

    def features(self, keys: tuple[str, ...], chunk_index: int) -> None:
        return None

    def close(self) -> None:
        pass


def no_camera(geometry: CameraGeometry, device: torch.device, dtype: torch.dtype) -> NoCamera:
    return NoCamera()


def default_intrinsics(width: int, height: int, horizontal_fov_degrees: float = 60.0) -> tuple[float, ...]:
    """``(fx, fy, cx, cy)`` of a centred pinhole with square pixels: an assumption for keyboard sessions, which
    come with no intrinsics file (the reference's offline examples ship one per scene)."""
    fx = 0.5 * width / math.tan(math.radians(horizontal_fov_degrees) / 2)
    return (fx, fx, width / 2, height / 2)


class LingBotCameraTrack:
    """Held keys -> the LingBot model package's camera features, integrating the pose across chunks."""

    def __init__(
        self, geometry: CameraGeometry, device: torch.device, dtype: torch.dtype, *, intrinsics=None, steps=None
    ) -> None:
        from telefuser.models.lingbot_world_v2 import camera  # the model package owns the geometry

        self._camera = camera
        self.geometry = geometry
        self.device, self.dtype = torch.device(device), dtype
        self.steps = steps if steps is not None else camera.ControlSteps()
        values = intrinsics if intrinsics is not None else default_intrinsics(geometry.width, geometry.height)
        self.intrinsics = torch.tensor(values, dtype=torch.float32)
        if self.intrinsics.shape != (4,):
            raise ValueError(f"intrinsics must be (fx, fy, cx, cy) for the canvas, got {values!r}")
        self._state = None

    def features(self, keys: tuple[str, ...], chunk_index: int) -> torch.Tensor:
        """``[1, F * (h/2) * (w/2), 1536]`` per-token camera features for this chunk."""
        g = self.geometry
        relative, self._state = self._camera.controls_to_relative_poses(
            keys, g.chunk_latent_frames, self._state, self.steps
        )
        features = self._camera.chunk_camera_features(relative, self.intrinsics, g.height, g.width)
        return features.to(device=self.device, dtype=self.dtype)

    def close(self) -> None:
        self._state = None


def lingbot_camera(*, intrinsics=None, steps=None) -> CameraFactory:
    """A factory of `LingBotCameraTrack`s (one per session) with fixed intrinsics and step sizes."""

    def factory(geometry: CameraGeometry, device: torch.device, dtype: torch.dtype) -> LingBotCameraTrack:
        return LingBotCameraTrack(geometry, device, dtype, intrinsics=intrinsics, steps=steps)

    return factory
