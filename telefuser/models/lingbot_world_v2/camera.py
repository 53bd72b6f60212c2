"""Camera conditioning as pure functions: keys -> camera poses -> per-pixel rays -> per-token features.

Poses are OpenCV camera-to-world matrices; keys act per pixel frame (4 per latent frame); the model sees framewise
relative poses with normalised translations and 6 ray channels ``[origin | unit direction]`` (the public code feeds
the origin, not the Plucker moment). The conventions and their sources are in this folder's README.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

import torch

from .controls import ACCEPTED_KEYS, canonical_key

VAE_STRIDE = 8  # pixels per latent pixel, each spatial axis
PIXEL_FRAMES_PER_LATENT = 4  # the Wan VAE's temporal stride


@dataclass(frozen=True)
class ControlSteps:
    """Step sizes per pixel frame (the v2 pipeline's values)."""

    move_step: float = 0.10
    lateral_step: float = 0.10
    yaw_step_degrees: float = 0.5
    pitch_step_degrees: float = 0.5
    pitch_limit_degrees: float = 85.0
    translation_scale: float = 1.0


@dataclass(frozen=True)
class CameraState:
    """The integrated camera between chunks: absolute c2w (float64), accumulated pitch, and whether any chunk
    was produced yet (the first chunk starts *at* the initial pose)."""

    c2w: torch.Tensor = field(default_factory=lambda: torch.eye(4, dtype=torch.float64))
    pitch: float = 0.0
    started: bool = False


def parse_control_keys(keys: Iterable[str]) -> frozenset[str]:
    """Key names (letters in either case, DOM codes, arrows) -> canonical actions. Unknown keys raise ValueError."""
    if isinstance(keys, str):
        keys = [keys]
    actions, unknown = set(), []
    for key in keys:
        canonical = canonical_key(str(key))
        if canonical is None:
            unknown.append(key)
        else:
            actions.add(canonical.lower())  # the integration below names actions by their lower-case key
    if unknown:
        raise ValueError(f"unknown control key(s) {unknown!r}; valid keys: {', '.join(ACCEPTED_KEYS)}")
    return frozenset(actions)


def _rotation(axis: str, angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    if axis == "x":
        rows = [[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]]
    else:  # "y"
        rows = [[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]]
    return torch.tensor(rows, dtype=torch.float64)


def _ground_unit(v: torch.Tensor) -> torch.Tensor:
    """v projected on the ground plane (y = 0), normalised; zero if vertical."""
    flat = torch.stack([v[0], torch.zeros_like(v[0]), v[2]])
    norm = flat.norm()
    return flat / norm if norm > 0 else flat


def step_camera(c2w: torch.Tensor, pitch: float, actions: frozenset[str], steps: ControlSteps):
    """One pixel frame: yaw about the world's vertical axis, pitch about the camera's x axis (clamped to
    +-pitch_limit), then translate on the ground plane along the new forward/right. Returns (c2w, pitch)."""
    pitch_step = math.radians(steps.pitch_step_degrees)
    pitch_delta = pitch_step * (("i" in actions) - ("k" in actions))
    if abs(pitch + pitch_delta) > math.radians(steps.pitch_limit_degrees):
        pitch_delta = 0.0
    yaw_delta = math.radians(steps.yaw_step_degrees) * (("l" in actions) - ("j" in actions))
    rotation = _rotation("y", yaw_delta) @ c2w[:3, :3] @ _rotation("x", pitch_delta)
    forward, right = _ground_unit(rotation[:, 2]), _ground_unit(rotation[:, 0])
    move = forward * steps.move_step * (("w" in actions) - ("s" in actions)) + right * steps.lateral_step * (
        ("d" in actions) - ("a" in actions)
    )
    out = torch.eye(4, dtype=torch.float64)
    out[:3, :3] = rotation
    out[:3, 3] = c2w[:3, 3] + move
    return out, pitch + pitch_delta


def control_poses(
    keys: Iterable[str], latent_frames: int, state: CameraState | None = None, steps: ControlSteps = ControlSteps()
) -> tuple[torch.Tensor, torch.Tensor | None, CameraState]:
    """Absolute c2w poses ``[latent_frames, 4, 4]`` (float64) for holding `keys` over one chunk, the pose before the
    chunk (None for the first chunk, whose first frame *is* the initial pose), and the state after it."""
    if latent_frames < 1:
        raise ValueError(f"latent_frames must be positive, got {latent_frames}")
    actions = parse_control_keys(keys)
    state = state or CameraState()
    c2w, pitch = state.c2w.to(torch.float64), state.pitch
    poses = [] if state.started else [c2w]
    previous = c2w if state.started else None
    while len(poses) < latent_frames:
        for _ in range(PIXEL_FRAMES_PER_LATENT):
            c2w, pitch = step_camera(c2w, pitch, actions, steps)
        poses.append(c2w)
    return torch.stack(poses), previous, CameraState(c2w, pitch, True)


def _se3_inverse(poses: torch.Tensor) -> torch.Tensor:
    rot_t = poses[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(poses)
    out[..., :3, :3] = rot_t
    out[..., :3, 3:] = -rot_t @ poses[..., :3, 3:]
    out[..., 3, 3] = 1.0
    return out


def relative_poses(
    c2ws: torch.Tensor,
    *,
    previous: torch.Tensor | None = None,
    normalize_translation: bool = True,
    translation_scale: float = 1.0,
) -> torch.Tensor:
    """Framewise relative poses ``[N, 4, 4]`` (float32): pose i relative to pose i-1; the first relative to
    `previous`, or the identity without one. Translations are divided by their largest norm (if non-zero)."""
    poses = c2ws.to(torch.float64)
    if previous is not None:
        poses = torch.cat([previous.to(torch.float64)[None], poses])
    rel = _se3_inverse(poses[:-1]) @ poses[1:]
    rel = rel if previous is not None else torch.cat([torch.eye(4, dtype=torch.float64)[None], rel])
    if normalize_translation:
        largest = rel[:, :3, 3].norm(dim=-1).max()
        if largest > 0:
            rel[:, :3, 3] = rel[:, :3, 3] / largest
    rel[:, :3, 3] *= translation_scale
    return rel.float()


def controls_to_relative_poses(
    keys: Iterable[str], latent_frames: int, state: CameraState | None = None, steps: ControlSteps = ControlSteps()
) -> tuple[torch.Tensor, CameraState]:
    """Keys held over one chunk -> the relative poses the model sees ``[latent_frames, 4, 4]``, and the new state."""
    poses, previous, state = control_poses(keys, latent_frames, state, steps)
    return relative_poses(poses, previous=previous, translation_scale=steps.translation_scale), state


def latent_frame_poses(c2ws: torch.Tensor) -> torch.Tensor:
    """Pixel-frame poses ``[4(F-1)+1, 4, 4]`` -> latent-frame poses ``[F, 4, 4]`` (every 4th): for such N that is
    exactly what the public linear/slerp resampling at ``linspace(0, N-1, F)`` gives."""
    n = c2ws.shape[0]
    if n < 1 or (n - 1) % PIXEL_FRAMES_PER_LATENT:
        raise ValueError(f"{n} pixel-frame poses do not map onto latent frames: expected 4(F-1)+1 poses")
    return c2ws[::PIXEL_FRAMES_PER_LATENT]


def scale_intrinsics(intrinsics: torch.Tensor, from_hw: tuple[int, int], to_hw: tuple[int, int]) -> torch.Tensor:
    """[fx, fy, cx, cy] for an image of size from_hw resized to to_hw (no crop)."""
    sy, sx = to_hw[0] / from_hw[0], to_hw[1] / from_hw[1]
    return intrinsics * torch.tensor([sx, sy, sx, sy], dtype=intrinsics.dtype, device=intrinsics.device)


def plucker_rays(poses: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Per-pixel rays ``[F, 6, H, W]`` (float32): channels ``[origin xyz | unit direction xyz]``.

    poses ``[F, 4, 4]`` c2w; intrinsics ``[4]`` or ``[F, 4]`` = (fx, fy, cx, cy) in pixels of this image size."""
    poses = poses.to(torch.float64)
    frames = poses.shape[0]
    k = intrinsics.to(device=poses.device, dtype=torch.float64).reshape(-1, 4).expand(frames, 4)
    fx, fy, cx, cy = (k[:, i, None, None] for i in range(4))
    v, u = torch.meshgrid(
        torch.arange(height, dtype=torch.float64, device=poses.device) + 0.5,
        torch.arange(width, dtype=torch.float64, device=poses.device) + 0.5,
        indexing="ij",
    )
    dirs = torch.stack([(u - cx) / fx, (v - cy) / fy, torch.ones_like(u - cx)], dim=-1)  # [F, H, W, 3]
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    world_dirs = torch.einsum("fij,fhwj->fhwi", poses[:, :3, :3], dirs)
    origins = poses[:, None, None, :3, 3].expand_as(world_dirs)
    return torch.cat([origins, world_dirs], dim=-1).permute(0, 3, 1, 2).float().contiguous()


def camera_tokens(
    rays: torch.Tensor, patch_size: tuple[int, int, int] = (1, 2, 2), vae_stride: int = VAE_STRIDE
) -> torch.Tensor:
    """Rays ``[F, 6, H, W]`` -> token features ``[(F/pt)*(H/(8ph))*(W/(8pw)), 6*64*pt*ph*pw]``: tokens raster
    (f, h, w) like the latent tokens; features (channel, dy, dx, pt, ph, pw) as the official rearranges give."""
    f, c, h, w = rays.shape
    pt, ph, pw = patch_size
    s = vae_stride
    if f % pt or h % (s * ph) or w % (s * pw):
        raise ValueError(f"rays {tuple(rays.shape)} do not split into {s}x{s} blocks and {patch_size} patches")
    x = rays.reshape(f // pt, pt, c, h // (s * ph), ph, s, w // (s * pw), pw, s)
    # dims: 0 f', 1 pt, 2 c, 3 h', 4 ph, 5 dy, 6 w', 7 pw, 8 dx  ->  (f', h', w') x (c, dy, dx, pt, ph, pw)
    x = x.permute(0, 3, 6, 2, 5, 8, 1, 4, 7)
    return x.reshape((f // pt) * (h // (s * ph)) * (w // (s * pw)), c * s * s * pt * ph * pw)


def chunk_camera_features(
    relative: torch.Tensor,
    intrinsics: torch.Tensor,
    height: int,
    width: int,
    patch_size: tuple[int, int, int] = (1, 2, 2),
) -> torch.Tensor:
    """One chunk's relative poses ``[F, 4, 4]`` -> model camera input ``[1, F*(H/16)*(W/16), 1536]`` (float32)."""
    return camera_tokens(plucker_rays(relative, intrinsics, height, width), patch_size)[None]
