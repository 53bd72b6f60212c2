"""The streaming service's model: LingBot-World v2 sessions behind the `SessionFactory` protocol.

One `WorldSessionPipeline` per worker (per torchrun group) holds the models and gives every session its own KV cache.
One GPU group computes one chunk at a time, so chunks of different sessions are serialised by one execution lock
(the service only guarantees one call at a time *per session*). `memory_estimate`: serving/README.md.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

import numpy as np
import torch

from telefuser.models.lingbot_world_v2.controls import KEY_BINDINGS

from ..common.warmup import warmup_wanted

log = logging.getLogger("telefuser.serving")
NATIVE_RESOLUTION = "832x480"  # the released model's canvas
ACTIVATION_ROW_FACTOR = 32
DECODE_FEATURE_MAPS = 24
LATENT_CHANNELS, CONDITION_CHANNELS = 16, 20


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
    return communicator.backend_name if communicator is not None else "none (one rank)"


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
    ):
        self._pipeline = pipeline
        self._lock = threading.Lock()
        self.defaults = defaults
        self.warmup_s: float | None = None
        self._dtype_bytes = torch.empty((), dtype=dtype).element_size()
        self._ulysses = max(1, int(ulysses_degree))
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
        """Bytes one session needs on this rank beyond the weights (serving/README.md); config is validated."""
        request = self._request(config)
        plan = self._pipeline.plan(
            resolution=request["resolution"],
            num_frames=request["num_frames"],
            fps=request["fps"],
            frame_policy=request["frame_policy"],
        )
        dit = self._pipeline.dit.config
        b, u = self._dtype_bytes, self._ulysses
        local_channels = dit.dim // u  # heads/U x head_dim
        window = dit.local_attn_size if dit.local_attn_size > 0 else plan.latent_frames  # -1: the whole session
        window_rows = max(window, plan.chunk_latent_frames) * plan.tokens_per_frame
        kv = 2 * dit.num_layers * window_rows * local_channels * b  # every layer's K and V (no scratch: a ring)
        text = 2 * dit.num_layers * getattr(dit, "text_len", 512) * local_channels * b
        grid = plan.latent_frames * plan.latent_height * plan.latent_width
        rows = plan.chunk_latent_frames * plan.tokens_per_frame
        base_dim = int(getattr(getattr(getattr(self._pipeline.vae, "model", None), "config", None), "base_dim", 96))
        pixels = plan.width * plan.height
        frames = max(plan.frames_per_chunk)
        return {
            "kv_window": kv + text,
            "latents": (LATENT_CHANNELS + CONDITION_CHANNELS) * grid * 4,
            "activations": -(-rows // u) * ACTIVATION_ROW_FACTOR * dit.dim * b,
            "decode": DECODE_FEATURE_MAPS * pixels * base_dim * 4 + frames * pixels * 3 * 5,
        }

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
    pipeline = LINGBOT_WORLD_V2.build_pipeline(args, runtime)
    tiny = args.checkpoint is None and args.config == "tiny"
    defaults = {
        "seed": 42,
        "resolution": args.resolution or ("128x96" if tiny else "832x480"),
        "num_frames": args.num_frames or 77,
        "fps": args.fps or 16,
        "frame_policy": "truncate",
    }
    weights = str(args.checkpoint) if args.checkpoint else "random (no checkpoint)"
    factory = LingBotSessionFactory(
        pipeline,
        defaults=defaults,
        max_sessions=args.max_sessions or 1,
        weights=weights,
        device=device,
        dtype=dtype,
        ulysses_degree=world,
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
