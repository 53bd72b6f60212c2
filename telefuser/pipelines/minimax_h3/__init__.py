"""MiniMax H3 text (T2VA), keyframes (FL2VA) and references (Ref2VA) to video+audio: scheduler, text encoder,
decoders, conditions and the pipeline.

The DiT lives in `telefuser.models.minimax_h3` and is imported lazily by `loading`; the VAEs and the scheduler are
diffusers' (`AutoencoderKLMiniMaxH3`, `AutoencoderKLMiniMaxH3Audio`, `MiniMaxH3Scheduler`).
"""

from .conditions import AudioReference, ImageReference, ReferencePolicy, VideoReference, load_reference
from .loading import PARTITIONS, build_minimax_h3_pipeline, resolve_partition
from .pipeline import MiniMaxH3Pipeline, MiniMaxH3Result, MiniMaxH3Timings, initial_noise, partition_for_task
from .scheduler import FlowSchedule, make_scheduler
from .shapes import ASPECT_RATIOS, MiniMaxH3Shape, plan_shape
from .vae import AudioDecoder, VideoDecoder

__all__ = [
    "ASPECT_RATIOS",
    "PARTITIONS",
    "AudioDecoder",
    "AudioReference",
    "FlowSchedule",
    "ImageReference",
    "MiniMaxH3Pipeline",
    "MiniMaxH3Result",
    "MiniMaxH3Shape",
    "MiniMaxH3Timings",
    "ReferencePolicy",
    "VideoDecoder",
    "VideoReference",
    "build_minimax_h3_pipeline",
    "initial_noise",
    "load_reference",
    "make_scheduler",
    "partition_for_task",
    "plan_shape",
    "resolve_partition",
]
