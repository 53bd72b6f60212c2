"""LingBot-World v2: the chunk-causal camera-conditioned Wan DiT, its session cache, camera maths and loader."""

from .camera import (
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
from .checkpoint import (
    RANDOM_WEIGHTS,
    CheckpointError,
    build_random_lingbot_dit,
    find_checkpoint,
    load_lingbot_dit,
)
from .config import LingBotConfigError, LingBotWorldV2Config
from .dit import CameraModulation, LingBotWorldV2DiT, keeps_fp32
from .kv_cache import KVWindow, SessionError, WindowPlan

__all__ = [
    "RANDOM_WEIGHTS",
    "CameraModulation",
    "CameraState",
    "CheckpointError",
    "ControlSteps",
    "KVWindow",
    "LingBotConfigError",
    "LingBotWorldV2Config",
    "LingBotWorldV2DiT",
    "SessionError",
    "WindowPlan",
    "build_random_lingbot_dit",
    "camera_tokens",
    "chunk_camera_features",
    "control_poses",
    "controls_to_relative_poses",
    "find_checkpoint",
    "keeps_fp32",
    "latent_frame_poses",
    "load_lingbot_dit",
    "parse_control_keys",
    "plucker_rays",
    "relative_poses",
    "scale_intrinsics",
]
