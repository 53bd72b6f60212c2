"""LingBot-World v2: the chunk-causal camera-conditioned Wan DiT, its KV window, camera maths, loader and
`ModelSpec`. The Wan parts it is built on live in `telefuser.models.wan`.

The names below are imported at first use, so that ``telefuser.models.lingbot_world_v2.spec`` imports without torch.
"""

from ..lazy_exports import lazy_exports

EXPORTS = {
    "camera": (
        "CameraState",
        "ControlSteps",
        "camera_tokens",
        "chunk_camera_features",
        "control_poses",
        "controls_to_relative_poses",
        "latent_frame_poses",
        "parse_control_keys",
        "plucker_rays",
        "relative_poses",
        "scale_intrinsics",
    ),
    "checkpoint": (
        "CheckpointError",
        "build_random_lingbot_dit",
        "find_checkpoint",
        "load_lingbot_dit",
    ),
    "config": ("LingBotConfigError", "LingBotWorldV2Config"),
    "dit": ("CameraModulation", "LingBotWorldV2DiT"),
    "kv_cache": ("KVWindow", "WindowError", "WindowSlots"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [name for names in EXPORTS.values() for name in names]
