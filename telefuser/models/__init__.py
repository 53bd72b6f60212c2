"""Model definitions: each model family lives in its own subpackage."""

from .minimax_h3 import MiniMaxH3Config, MiniMaxH3DiT, build_random_minimax_h3_dit, load_minimax_h3_dit

__all__ = ["MiniMaxH3Config", "MiniMaxH3DiT", "build_random_minimax_h3_dit", "load_minimax_h3_dit"]
