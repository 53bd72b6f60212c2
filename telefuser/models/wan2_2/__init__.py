"""Wan 2.2: T2V-A14B (two experts switched at a boundary timestep) and TI2V-5B, on the Wan base (`models.wan`): its
released variants, one expert's DiT, its loaders and `ModelSpec`s.

The names below are imported at first use, so that ``telefuser.models.wan2_2.spec`` imports without torch.
"""

from ..lazy_exports import lazy_exports

EXPORTS = {
    "checkpoint": ("CheckpointError", "build_random_wan22_dit", "expert_dirs", "load_wan22_dit"),
    "config": ("RELEASES", "Wan22Config", "Wan22ConfigError", "Wan22Release", "release"),
    "dit": ("Wan22DiT",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [name for names in EXPORTS.values() for name in names]
