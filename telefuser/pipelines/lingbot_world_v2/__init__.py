"""LingBot-World v2 session pipeline: chunked autoregressive image-to-video, steered by keyboard controls.

The causal DiT, its camera geometry and its key vocabulary live in `telefuser.models.lingbot_world_v2`; the
pipeline drives any DiT with the same session contract. See README.md for facts, sources and assumptions.
"""

from ...models.lingbot_world_v2.controls import CONTROL_KEYS, normalize_keys  # the model's vocabulary
from .camera_control import (
    CameraFactory,
    CameraGeometry,
    CameraTrack,
    LingBotCameraTrack,
    NoCamera,
    default_intrinsics,
    lingbot_camera,
    no_camera,
)
from .controls import ControlTrace, load_control_trace, parse_control_trace
from .loading import build_lingbot_pipeline, resolve_checkpoint
from .metrics import format_summary, seconds_summary, summarize
from .request import FRAME_POLICIES, SessionShape, parse_resolution, plan_session
from .scheduler import DenoisingSchedule, flow_to_x0, flow_unipc_tables, renoise
from .session import DIT_IN_DIM, Chunk, WorldSession, WorldSessionPipeline

__all__ = [
    "CONTROL_KEYS",
    "CameraFactory",
    "CameraGeometry",
    "CameraTrack",
    "Chunk",
    "ControlTrace",
    "DIT_IN_DIM",
    "DenoisingSchedule",
    "FRAME_POLICIES",
    "LingBotCameraTrack",
    "NoCamera",
    "SessionShape",
    "WorldSession",
    "WorldSessionPipeline",
    "build_lingbot_pipeline",
    "default_intrinsics",
    "flow_to_x0",
    "flow_unipc_tables",
    "format_summary",
    "lingbot_camera",
    "load_control_trace",
    "no_camera",
    "normalize_keys",
    "parse_control_trace",
    "parse_resolution",
    "plan_session",
    "renoise",
    "resolve_checkpoint",
    "seconds_summary",
    "summarize",
]
