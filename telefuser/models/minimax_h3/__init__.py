"""MiniMax H3: the packed audio-video DiT, its tensor-parallel plan, its checkpoint loader and its `ModelSpec`.

The names below are imported at first use, so that ``telefuser.models.minimax_h3.spec`` imports without torch.
"""

from ..lazy_exports import lazy_exports

EXPORTS = {
    "adaln_tables": ("AdaLNTables", "adaln_table_bytes"),
    "checkpoint": ("RANDOM_WEIGHTS", "CheckpointError", "build_random_minimax_h3_dit", "load_minimax_h3_dit"),
    "checkpoint_formats": ("QKV_LAYOUTS", "grouped_qkv_to_fused"),
    "config": ("MiniMaxH3Config", "MiniMaxH3ConfigError"),
    "dit": ("FP32_BUFFER_NAMES", "FP32_PARAMETER_NAMES", "TIMESTEP_SCALE", "MiniMaxH3DiT"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [name for names in EXPORTS.values() for name in names]
