"""MiniMax H3 text-to-video+audio (T2VA): scheduler, text encoder, decoders and the pipeline.

The DiT lives in `telefuser.models.minimax_h3` and is imported lazily by `loading`; the VAEs and the scheduler are
diffusers' (`AutoencoderKLMiniMaxH3`, `AutoencoderKLMiniMaxH3Audio`, `MiniMaxH3Scheduler`).
"""

from .loading import build_minimax_h3_pipeline, resolve_partition
from .pipeline import MiniMaxH3Pipeline, MiniMaxH3Result, MiniMaxH3Timings, initial_noise
from .scheduler import FlowSchedule, make_scheduler
from .shapes import ASPECT_RATIOS, MiniMaxH3Shape, plan_shape
from .vae import AudioDecoder, VideoDecoder

__all__ = [
    "ASPECT_RATIOS",
    "AudioDecoder",
    "FlowSchedule",
    "MiniMaxH3Pipeline",
    "MiniMaxH3Result",
    "MiniMaxH3Shape",
    "MiniMaxH3Timings",
    "VideoDecoder",
    "build_minimax_h3_pipeline",
    "initial_noise",
    "make_scheduler",
    "plan_shape",
    "resolve_partition",
]
