"""The streaming service in front of the real (tiny, random-weight) LingBot-World v2 pipeline."""

from __future__ import annotations

import argparse
import base64
import io
import json
import zlib

import httpx
import numpy as np
from PIL import Image

from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.envelope import unpack
from telefuser.serving.stream.lingbot import build_lingbot_factory


def _args(**overrides) -> argparse.Namespace:
    args = dict(
        config="tiny",
        checkpoint=None,
        device="cpu",
        dtype="float32",
        attn_impl=None,
        resolution="64x48",
        num_frames=29,
        fps=16,
        max_sessions=1,
    )
    args.update(overrides)
    return argparse.Namespace(**args)


def _png() -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_lingbot_session_streams_every_frame_over_the_websocket():
    from websockets.sync.client import connect

    factory = build_lingbot_factory(_args())
    assert factory.metadata["weights"] == "random (no checkpoint)"
    app = create_stream_app(factory, max_sessions=1, codec="raw", ack_timeout_s=5.0)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, trust_env=False) as http:
        bad = http.post("/v1/stream/sessions", json={"prompt": "x", "image": _png(), "config": {"num_frames": 30}})
        assert bad.status_code == 422 and "4" in bad.json()["detail"]  # 1 + 4k frames
        s = http.post("/v1/stream/sessions", json={"prompt": "a road past a barn", "image": _png()}).json()
        assert s["total_chunks"] == 2
        headers, events = [], []
        with connect(base.replace("http", "ws") + s["ws_path"], max_size=None, proxy=None) as ws:
            ws.send(json.dumps({"type": "control", "keys": ["W"]}))
            while True:
                msg = ws.recv(timeout=120)
                if isinstance(msg, bytes):
                    header, frames = unpack(msg)
                    headers.append(header)
                    assert [zlib.crc32(f) for f in frames] == header["crc32"]
                    continue
                event = json.loads(msg)
                events.append(event)
                if event["stage"] == "done":
                    ws.send(json.dumps({"type": "delivery_ack", "published_frames": event["published_frames"]}))
                if event["stage"] in ("delivery_ack", "closed") or event.get("fatal"):
                    break
    assert [h["chunk"] for h in headers] == [0, 1] and [h["frames"] for h in headers] == [13, 16]
    done = next(e for e in events if e["stage"] == "done")
    assert done["published_frames"] == 29 and events[-1]["match"] is True
    measurement = next(e for e in events if e["stage"] == "chunk_sent")["measurement"]
    assert measurement["compute_seconds"] > 0 and set(measurement["phases"]) >= {"dit_s", "decode_s"}


def test_warm_up_runs_a_discarded_session_only_when_asked():
    assert "warmup_s" not in build_lingbot_factory(_args()).metadata  # auto: only on CUDA
    factory = build_lingbot_factory(_args(warmup="on"))
    assert factory.metadata["warmup_s"] > 0
    assert factory.metadata["ulysses_transport"] == "none (one rank)"
    # the warm-up left nothing behind: a real session still starts at chunk 0 with its own frames
    session = factory.create(np.full((48, 64, 3), 9, np.uint8), "after warm-up", {})
    try:
        chunk = session.next_chunk([])
        assert chunk.index == 0 and chunk.frames.shape[0] == 13
    finally:
        session.close()


def test_metadata_reports_the_transport_the_communicator_chose_after_start_up():
    """The communicator picks its transport at the first exchange (the CUDA warm-up), after the factory is built: the
    metadata must name the transport in use, not the one before any exchange."""
    from types import SimpleNamespace

    from telefuser.serving.stream.lingbot import LingBotSessionFactory

    communicator = SimpleNamespace(transport="portable")
    pipeline = SimpleNamespace(dit=SimpleNamespace(communicator=communicator))
    factory = LingBotSessionFactory(
        pipeline, defaults={"resolution": "64x48", "fps": 16}, max_sessions=1, weights="random (no checkpoint)"
    )
    assert factory.metadata["ulysses_transport"] == "portable"
    communicator.transport = "ce-ipc"  # what the first exchange on a shared GPU selects
    factory.warmup_s = 1.5
    assert factory.metadata["ulysses_transport"] == "ce-ipc" and factory.metadata["warmup_s"] == 1.5


def test_the_memory_estimate_counts_the_kv_window_the_session_allocates():
    """The kv_window term is the bytes the session's cache really holds (layers' K/V, text K/V; no scratch)."""
    factory = build_lingbot_factory(_args())
    config = {**factory.defaults, "resolution": "96x64"}
    estimate = factory.memory_estimate(config)
    session = factory.create(np.full((64, 96, 3), 9, np.uint8), "a barn", config)
    try:
        cache = session._session._kv_window  # the DiT's KV window (kv_cache.KVWindow)
        tensors = [t for layer in cache.layers for t in (layer.k, layer.v, layer.cross_k, layer.cross_v)]
        assert estimate["kv windows"] == sum(t.numel() * t.element_size() for t in tensors)  # bytes: exact
    finally:
        session.close()
    # what the session holds throughout, and its largest stage (the memory plan's workload, memory/plan.py)
    stages = [k for k in estimate if k.startswith("stage ")]
    assert set(estimate) == {"kv windows", "latents", *stages} and len(stages) == 1 and min(estimate.values()) > 0
    bigger = factory.memory_estimate({**config, "resolution": "192x128"})
    assert bigger["kv windows"] > estimate["kv windows"] and sum(bigger.values()) > sum(estimate.values())


def test_the_tiny_model_service_refuses_a_session_past_its_memory_share():
    from telefuser.serving.stream.limits import StreamLimitFlags

    factory = build_lingbot_factory(_args())
    app = create_stream_app(factory, max_sessions=1, limits=StreamLimitFlags(max_session_memory_gib=0.05))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, trust_env=False) as http:
        meta = http.get("/v1/service/metadata").json()
        assert meta["model"]["native_resolution"] == "832x480" and meta["limits"]["max_width"] == 1664
        r = http.post("/v1/stream/sessions", json={"prompt": "x", "image": _png(), "config": {"resolution": "640x480"}})
        assert r.status_code == 422 and "max_session_memory_bytes=51.2 MiB" in r.json()["detail"], r.text
        assert "kv windows" in r.json()["detail"] and "stage " in r.json()["detail"]
        ok = http.post("/v1/stream/sessions", json={"prompt": "x", "image": _png()})
        assert ok.status_code == 201, ok.text


def test_the_vae_options_reach_the_pipeline():
    import torch

    from telefuser.cli import build_parser

    parsed = build_parser().parse_args(["serve-stream", "--vae-dtype", "bfloat16", "--vae-fast"])
    assert parsed.vae_dtype == "bfloat16" and parsed.vae_fast
    factory = build_lingbot_factory(_args(vae_dtype="bfloat16", vae_fast=True))
    vae = factory._pipeline.vae
    assert vae.dtype == torch.bfloat16 and "channels-last, fused norm+SiLU" in vae.description
    assert not any(isinstance(getattr(m, "nonlinearity", None), torch.nn.SiLU) for m in vae.model.modules())
    factory.close()
