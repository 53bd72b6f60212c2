"""The streaming service's model: LingBot-World v2 sessions behind the `SessionFactory` protocol.

One `WorldSessionPipeline` per worker (per torchrun group) holds the models and gives every session its own KV cache.
One GPU group computes one chunk at a time, so chunks of different sessions are serialised by one execution lock
(the service only guarantees one call at a time *per session*). `memory_estimate`: serving/README.md.
"""

from __future__ import annotations

import argparse
import functools
import logging
import threading
from typing import Any

import numpy as np
import torch

from telefuser.memory.plan import plan_or_exit
from telefuser.models.lingbot_world_v2.controls import KEY_BINDINGS
from telefuser.pipelines.lingbot_world_v2.request import plan_session

from ..common.startup import StartupError
from ..common.warmup import warmup_wanted

log = logging.getLogger("telefuser.serving")
NATIVE_RESOLUTION = "832x480"  # the released model's canvas


class _LockedSession:
    """A world session whose chunks and close wait for the factory's one execution lock."""

    def __init__(self, session, lock: threading.Lock):
        self._session = session
        self._lock = lock
        self.total_chunks = session.total_chunks
        self.total_frames = session.plan.num_frames

    def next_chunk(self, keys: list[str]):
        with self._lock:
            return self._session.next_chunk(keys)

    def close(self) -> None:
        with self._lock:
            self._session.close()


def _transport_name(pipeline) -> str:
    communicator = getattr(getattr(pipeline, "dit", None), "communicator", None)
    return communicator.transport if communicator is not None else "none (one rank)"


class LingBotSessionFactory:
    def __init__(
        self,
        pipeline,
        *,
        defaults: dict[str, Any],
        max_sessions: int,
        weights: str,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        ulysses_degree: int = 1,
        memory_plan=None,
        memory=None,
    ):
        """`memory_plan`: the service's `memory.plan.MemoryPlan` (its placement); `memory(request)`: the model's
        workload of one session request, for each session's estimate."""
        self._pipeline = pipeline
        self._lock = threading.Lock()
        self.defaults = defaults
        self.warmup_s: float | None = None
        self._memory_plan, self._memory = memory_plan, memory
        self._fixed_metadata = {
            "model": "LingBot-World v2",
            "weights": weights,
            "resolutions": [defaults["resolution"]],
            "native_resolution": NATIVE_RESOLUTION,
            "device": device,
            "fps": defaults["fps"],
            "max_sessions": max_sessions,
            "chunk_frames": {"first": 13, "later": 16},
            "defaults": dict(defaults),
            "key_bindings": dict(KEY_BINDINGS),  # the model's own vocabulary: what the stream contract accepts
        }

    @property
    def metadata(self) -> dict[str, Any]:
        # read live: the communicator picks its transport at the first exchange (the warm-up or the first chunk)
        live = {"ulysses_transport": _transport_name(self._pipeline)}
        if self.warmup_s is not None:
            live["warmup_s"] = self.warmup_s
        return {**self._fixed_metadata, **live}

    def _request(self, config: dict) -> dict:
        request = {**self.defaults, **(config or {})}
        if request.get("num_frames") is None:
            raise ValueError("num_frames is required: open-ended sessions are not supported")
        return request

    def validate(self, image: np.ndarray, prompt: str, config: dict) -> None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        request = self._request(config)
        self._pipeline.plan(
            resolution=request["resolution"],
            num_frames=request["num_frames"],
            fps=request["fps"],
            frame_policy=request["frame_policy"],
        )

    def memory_estimate(self, config: dict) -> dict[str, int]:
        """Bytes one session needs on this rank beyond what stays resident: its KV window and latents and its largest
        stage, from the model's memory workload under the service's placement (serving/README.md); config is
        validated."""
        from telefuser.memory.plan import MemoryPlan

        request = self._request(config)
        session = {**{k: request[k] for k in ("resolution", "num_frames", "fps")}, "sessions": 1}
        job = MemoryPlan(self._memory(session), self._memory_plan.placement, None, "")
        stage = job.peak_stage
        return {**job.workload.held, f"stage {stage}": job.stage_bytes()[stage]}

    def create(self, image: np.ndarray, prompt: str, config: dict) -> _LockedSession:
        request = self._request(config)
        with self._lock:
            session = self._pipeline.start(
                image,
                prompt,
                seed=int(request["seed"]),
                resolution=request["resolution"],
                num_frames=int(request["num_frames"]),
                fps=request["fps"],
                frame_policy=request["frame_policy"],
            )
        return _LockedSession(session, self._lock)

    def close(self) -> None:
        self._pipeline.close()


def build_lingbot_factory(args: argparse.Namespace) -> LingBotSessionFactory:
    """`telefuser serve-stream --model lingbot_world_v2`: the LingBot pipeline on this rank (Ulysses over the torchrun
    world)."""
    from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
    from telefuser.runtime import Runtime

    runtime = Runtime.from_args(args)
    device, dtype, world = str(runtime.device), runtime.dtype, runtime.world_size
    tiny = args.checkpoint is None and args.config == "tiny"
    defaults = {
        "seed": 42,
        "resolution": args.resolution or ("128x96" if tiny else "832x480"),
        "num_frames": args.num_frames or 77,
        "fps": args.fps or 16,
        "frame_policy": "truncate",
    }
    try:  # a session that names none of these must be one this service makes: else every such create is a 422
        plan_session(**{k: defaults[k] for k in ("resolution", "num_frames", "fps", "frame_policy")})
    except ValueError as exc:
        raise StartupError(f"the session defaults: {exc}; change --resolution, --num-frames or --fps") from None
    # the plan holds --max-sessions default sessions at once; each session is checked again when it is made
    request = {**{k: defaults[k] for k in ("resolution", "num_frames", "fps")}, "sessions": args.max_sessions or 1}
    memory_plan = plan_or_exit(LINGBOT_WORLD_V2, args, runtime, request)
    pipeline = LINGBOT_WORLD_V2.build_pipeline(args, runtime, placement=memory_plan.placement)
    weights = str(args.checkpoint) if args.checkpoint else "random (no checkpoint)"
    factory = LingBotSessionFactory(
        pipeline,
        defaults=defaults,
        max_sessions=args.max_sessions or 1,
        weights=weights,
        device=device,
        dtype=dtype,
        ulysses_degree=world,
        memory_plan=memory_plan,
        memory=functools.partial(LINGBOT_WORLD_V2.memory_workload, args, runtime.parallel, runtime.dtype),
    )
    if warmup_wanted(args, device):  # every rank: the DiT is collective; with CUDA graphs it also captures them
        seconds = pipeline.warm_up(resolution=defaults["resolution"], fps=defaults["fps"])
        factory.warmup_s = round(seconds, 3)
        graphs = getattr(pipeline.dit, "graphs", None)
        log.info(
            "warm-up session (%d chunks at %s) took %.1f s%s",
            pipeline.warm_up_chunks(),
            defaults["resolution"],
            seconds,
            f", {graphs.captures} CUDA graphs captured" if graphs is not None else "",
        )
    return factory
