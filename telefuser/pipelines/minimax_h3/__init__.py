"""MiniMax H3 text-to-video+audio (T2VA): scheduler, text encoder, decoders and the pipeline.

The DiT lives in `telefuser.models.minimax_h3` and is imported lazily by `loading`; everything here imports
without it.
"""

from .loading import build_minimax_h3_pipeline, resolve_partition
from .pipeline import MiniMaxH3Pipeline, MiniMaxH3Result, MiniMaxH3Timings, initial_noise
from .scheduler import FlowSchedule, euler_eta0_step, time_shift_sigmas, velocity_to_x0
from .shapes import ASPECT_RATIOS, MiniMaxH3Shape, plan_shape

__all__ = [
    "ASPECT_RATIOS",
    "FlowSchedule",
    "MiniMaxH3Pipeline",
    "MiniMaxH3Result",
    "MiniMaxH3Shape",
    "MiniMaxH3Timings",
    "build_minimax_h3_pipeline",
    "euler_eta0_step",
    "initial_noise",
    "plan_shape",
    "resolve_partition",
    "time_shift_sigmas",
    "velocity_to_x0",
]
