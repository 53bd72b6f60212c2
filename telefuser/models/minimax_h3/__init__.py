"""MiniMax H3: the packed audio-video DiT, its tensor-parallel plan and its checkpoint loader."""

from .checkpoint import (
    RANDOM_WEIGHTS,
    CheckpointError,
    build_random_minimax_h3_dit,
    fused_qkv_to_grouped,
    grouped_qkv_to_fused,
    load_minimax_h3_dit,
)
from .config import MiniMaxH3Config, MiniMaxH3ConfigError
from .dit import FP32_BUFFER_NAMES, FP32_PARAMETER_NAMES, TIMESTEP_SCALE, MiniMaxH3DiT

__all__ = [
    "FP32_BUFFER_NAMES",
    "FP32_PARAMETER_NAMES",
    "RANDOM_WEIGHTS",
    "TIMESTEP_SCALE",
    "CheckpointError",
    "MiniMaxH3Config",
    "MiniMaxH3ConfigError",
    "MiniMaxH3DiT",
    "build_random_minimax_h3_dit",
    "fused_qkv_to_grouped",
    "grouped_qkv_to_fused",
    "load_minimax_h3_dit",
]
