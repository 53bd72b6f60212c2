"""MiniMax H3: the packed audio-video DiT, its tensor-parallel plan and its checkpoint loader."""

from .adaln_tables import AdaLNTables, adaln_table_bytes
from .checkpoint import RANDOM_WEIGHTS, CheckpointError, build_random_minimax_h3_dit, load_minimax_h3_dit
from .checkpoint_formats import QKV_LAYOUTS, grouped_qkv_to_fused
from .config import MiniMaxH3Config, MiniMaxH3ConfigError
from .dit import FP32_BUFFER_NAMES, FP32_PARAMETER_NAMES, TIMESTEP_SCALE, MiniMaxH3DiT

__all__ = [
    "FP32_BUFFER_NAMES",
    "FP32_PARAMETER_NAMES",
    "QKV_LAYOUTS",
    "RANDOM_WEIGHTS",
    "TIMESTEP_SCALE",
    "AdaLNTables",
    "CheckpointError",
    "MiniMaxH3Config",
    "MiniMaxH3ConfigError",
    "MiniMaxH3DiT",
    "adaln_table_bytes",
    "build_random_minimax_h3_dit",
    "grouped_qkv_to_fused",
    "load_minimax_h3_dit",
]
