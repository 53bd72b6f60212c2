"""The streaming service's model: LingBot-World v2 sessions behind the `SessionFactory` protocol.

One `WorldSessionPipeline` per worker (per torchrun group) holds the DiT, text encoder and VAE; every session gets its
own KV cache from it. One GPU group computes one chunk at a time, so chunk computations of different sessions are
serialised by one execution lock (the service only guarantees one call at a time *per session*).
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import Any

import numpy as np
import torch

log = logging.getLogger("telefuser.serving")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class LingBotSession:
    """One world: `next_chunk(keys)` computes the next chunk with the keys held since the previous one."""

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
    return communicator.backend_name if communicator is not None else "none (one rank)"


class LingBotSessionFactory:
    def __init__(self, pipeline, *, defaults: dict[str, Any], max_sessions: int, weights: str):
        self._pipeline = pipeline
        self._lock = threading.Lock()
        self.defaults = defaults
        self.warmup_s: float | None = None
        self._fixed_metadata = {
            "model": "LingBot-World v2",
            "weights": weights,
            "resolutions": [defaults["resolution"]],
            "fps": defaults["fps"],
            "max_sessions": max_sessions,
            "defaults": dict(defaults),
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
            resolution=request["resolution"], num_frames=request["num_frames"], fps=request["fps"],
            frame_policy=request["frame_policy"],
        )

    def create(self, image: np.ndarray, prompt: str, config: dict) -> LingBotSession:
        request = self._request(config)
        with self._lock:
            session = self._pipeline.start(
                image, prompt, seed=int(request["seed"]), resolution=request["resolution"],
                num_frames=int(request["num_frames"]), fps=request["fps"], frame_policy=request["frame_policy"],
            )
        return LingBotSession(session, self._lock)

    def close(self) -> None:
        self._pipeline.close()


def build_lingbot_factory(args: argparse.Namespace) -> LingBotSessionFactory:
    """`telefuser serve-stream` without --fake: the LingBot pipeline on this rank (Ulysses over the torchrun world)."""
    from ..distributed.mesh import ParallelConfig, init_distributed
    from ..pipelines.lingbot_world_v2 import build_lingbot_pipeline

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    mesh = init_distributed(ParallelConfig(ulysses_degree=world)) if world > 1 else None
    dtype = DTYPES[args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")]
    pipeline = build_lingbot_pipeline(
        config=args.config, checkpoint=args.checkpoint, device=device, dtype=dtype, mesh=mesh,
        attn_impl=args.attn_impl or "sdpa",
    )
    tiny = args.checkpoint is None and args.config == "tiny"
    defaults = {
        "seed": 42,
        "resolution": args.resolution or ("128x96" if tiny else "832x480"),
        "num_frames": args.num_frames or 77,
        "fps": args.fps or 16,
        "frame_policy": "truncate",
    }
    weights = str(args.checkpoint) if args.checkpoint else "random (no checkpoint)"
    factory = LingBotSessionFactory(pipeline, defaults=defaults, max_sessions=args.max_sessions or 1, weights=weights)
    warmup = getattr(args, "warmup", "auto")
    if warmup == "on" or (warmup == "auto" and device.startswith("cuda")):  # every rank: the DiT is collective
        seconds = pipeline.warm_up(resolution=defaults["resolution"], fps=defaults["fps"])
        factory.warmup_s = round(seconds, 3)
        log.info("warm-up session (2 chunks at %s) took %.1f s", defaults["resolution"], seconds)
    return factory
