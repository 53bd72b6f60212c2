"""Camera conditioning maths: keys -> poses, rays from known geometry, and the per-token feature layout."""

from __future__ import annotations

import math

import pytest
import torch

from telefuser.models.lingbot_world_v2 import (
    CameraState,
    ControlSteps,
    camera_tokens,
    chunk_camera_features,
    control_poses,
    controls_to_relative_poses,
    latent_frame_poses,
    parse_control_keys,
    plucker_rays,
    relative_poses,
    scale_intrinsics,
)

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)

H, W = 32, 48
K = torch.tensor([40.0, 36.0, 23.0, 15.0])  # fx, fy, cx, cy


def _pixel_directions():
    v, u = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    d = torch.stack([(u - K[2]) / K[0], (v - K[3]) / K[1], torch.ones(H, W)], dim=0)
    return d / d.norm(dim=0, keepdim=True)


def _yaw(angle):
    c, s = math.cos(angle), math.sin(angle)
    pose = torch.eye(4)
    pose[:3, :3] = torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    return pose


def test_identity_pose_gives_normalised_pixel_directions_and_zero_origin():
    rays = plucker_rays(torch.eye(4)[None], K, H, W)
    assert rays.shape == (1, 6, H, W) and rays.dtype == torch.float32
    assert torch.equal(rays[0, :3], torch.zeros(3, H, W))
    torch.testing.assert_close(rays[0, 3:], _pixel_directions())
    torch.testing.assert_close(rays[0, 3:].norm(dim=0), torch.ones(H, W))


def test_yaw_rotates_every_direction_by_the_yaw_angle_about_the_vertical():
    angle = math.radians(30.0)
    rays = plucker_rays(torch.stack([torch.eye(4), _yaw(angle)]), K, H, W)
    d0, d1 = rays[0, 3:], rays[1, 3:]
    torch.testing.assert_close(d1[1], d0[1])  # the vertical component is untouched
    flat0, flat1 = d0[[0, 2]], d1[[0, 2]]
    cos = (flat0 * flat1).sum(0) / (flat0.norm(dim=0) * flat1.norm(dim=0))
    torch.testing.assert_close(cos, torch.full((H, W), math.cos(angle)))
    # A positive yaw turns the optical axis to +x (the right, in OpenCV coordinates).
    centre = plucker_rays(_yaw(angle)[None], torch.tensor([1.0, 1.0, 0.5, 0.5]), 1, 1)[0, 3:, 0, 0]
    torch.testing.assert_close(centre, torch.tensor([math.sin(angle), 0.0, math.cos(angle)]))


def test_translation_sets_the_origin_channels_and_not_the_directions():
    pose = _yaw(0.4)
    pose[:3, 3] = torch.tensor([0.3, -0.2, 1.5])
    rays = plucker_rays(pose[None], K, H, W)
    torch.testing.assert_close(rays[0, :3], pose[:3, 3, None, None].expand(3, H, W))
    torch.testing.assert_close(rays[0, 3:], plucker_rays(_yaw(0.4)[None], K, H, W)[0, 3:])


def test_camera_tokens_follow_the_official_rearranges():
    frames = 2
    rays = torch.randn(frames, 6, H, W)
    tokens = camera_tokens(rays)
    hp, wp = H // 16, W // 16
    assert tokens.shape == (frames * hp * wp, 6 * 64 * 4)
    # 'f (h c1) (w c2) c -> (f h w) (c c1 c2)' then 'c (f p1) (h p2) (w p3) -> (f h w) (c p1 p2 p3)'
    lat = rays.reshape(frames, 6, H // 8, 8, W // 8, 8).permute(0, 2, 4, 1, 3, 5).reshape(frames, H // 8, W // 8, 384)
    f, i, j, ph, pw, c, dy, dx = 1, 1, 2, 1, 0, 4, 5, 3
    token = (f * hp + i) * wp + j
    feature = ((c * 8 + dy) * 8 + dx) * 4 + ph * 2 + pw
    assert tokens[token, feature] == lat[f, 2 * i + ph, 2 * j + pw, (c * 8 + dy) * 8 + dx]
    assert tokens[token, feature] == rays[f, c, (2 * i + ph) * 8 + dy, (2 * j + pw) * 8 + dx]
    with pytest.raises(ValueError, match="8x8 blocks"):
        camera_tokens(rays[..., :40])


def test_keys_parse_case_insensitively_and_unknown_keys_list_the_valid_ones():
    assert parse_control_keys(["W", "a", "KeyL", "ArrowUp", "ArrowLeft"]) == {"w", "a", "l", "j"}
    assert parse_control_keys("ArrowDown") == {"s"}
    with pytest.raises(ValueError, match=r"unknown control key\(s\) \['Q', 'space'\]; valid keys: W, A, S, D"):
        parse_control_keys(["w", "Q", "space"])


def test_forward_key_moves_along_the_optical_axis_by_four_steps_per_latent_frame():
    steps = ControlSteps()
    poses, previous, state = control_poses(["w"], 3)
    assert previous is None and poses.shape == (3, 4, 4)
    assert torch.equal(poses[0], torch.eye(4, dtype=torch.float64))  # the first chunk starts at the initial pose
    torch.testing.assert_close(poses[2, :3, 3], torch.tensor([0.0, 0.0, 8 * steps.move_step], dtype=torch.float64))
    rel = relative_poses(poses)
    torch.testing.assert_close(rel[0], torch.eye(4))
    torch.testing.assert_close(rel[1:, :3, 3], torch.tensor([[0.0, 0.0, 1.0]] * 2))  # normalised per chunk
    # The next chunk continues from the state and is relative to the previous chunk's last pose.
    rel2, state2 = controls_to_relative_poses(["d"], 2, state)
    torch.testing.assert_close(rel2[:, :3, 3], torch.tensor([[1.0, 0.0, 0.0]] * 2))
    torch.testing.assert_close(state2.c2w[:3, 3], torch.tensor([0.8, 0.0, 0.8], dtype=torch.float64))
    scaled, _ = controls_to_relative_poses(["s"], 2, state, ControlSteps(translation_scale=2.0))
    torch.testing.assert_close(scaled[:, :3, 3], torch.tensor([[0.0, 0.0, -2.0]] * 2))


def test_yaw_and_pitch_keys_turn_by_their_step_and_pitch_is_clamped():
    rel, state = controls_to_relative_poses(["l"], 2, CameraState(started=True))
    angle = math.acos(rel[0, 0, 0].item())
    assert angle == pytest.approx(math.radians(4 * 0.5), abs=1e-6) and rel[0, 0, 2] > 0  # turned right
    assert torch.equal(rel[:, :3, 3], torch.zeros(2, 3))  # turning alone does not move
    rel, _ = controls_to_relative_poses(["i"], 1, CameraState(started=True))
    assert rel[0, 1, 2] < 0  # looking up: the optical axis gains -y (up in OpenCV)
    steps = ControlSteps(pitch_step_degrees=10.0, pitch_limit_degrees=25.0)
    _, state = controls_to_relative_poses(["i"], 3, CameraState(started=True), steps)
    assert math.degrees(state.pitch) == pytest.approx(20.0)


def test_latent_frame_mapping_intrinsics_and_chunk_features():
    pixel_poses = torch.eye(4).repeat(9, 1, 1)
    pixel_poses[:, 2, 3] = torch.arange(9.0)
    assert latent_frame_poses(pixel_poses)[:, 2, 3].tolist() == [0.0, 4.0, 8.0]
    with pytest.raises(ValueError, match="4\\(F-1\\)\\+1"):
        latent_frame_poses(pixel_poses[:8])
    scaled = scale_intrinsics(torch.tensor([400.0, 400.0, 416.0, 240.0]), (480, 832), (240, 416))
    assert scaled.tolist() == [200.0, 200.0, 208.0, 120.0]
    features = chunk_camera_features(torch.eye(4).repeat(2, 1, 1), K, H, W)
    assert features.shape == (1, 2 * (H // 16) * (W // 16), 1536)
