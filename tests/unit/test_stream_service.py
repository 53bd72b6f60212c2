"""The streaming service against the fake model: HTTP API, WebSocket lossless delivery, controls, SSE, teardown.

Tests that need real TCP (a slow client, disconnects, Ctrl-C) run uvicorn in a thread or a subprocess; the rest use
Starlette's TestClient.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import signal
import sys
import threading
import time
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.envelope import decode_frames, unpack
from telefuser.serving.stream.fake import FakeSessionFactory
from telefuser.serving.stream.metrics import StreamMetrics
from telefuser.serving.stream.events import DoneItem
from telefuser.serving.stream.session import StreamSessionState
from telefuser.serving.stream.settings import StreamSettings
from tests import hostile_values as hv
from tools.harness.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
SMALL = {"resolution": "64x48", "num_frames": 45}  # 3 chunks: 13 + 16 + 16 frames


def image_bytes(fmt: str = "PNG", size=(64, 48)) -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


IMAGE_B64 = base64.b64encode(image_bytes()).decode()


def body(**overrides):
    out = {"prompt": "a quiet harbour", "image": IMAGE_B64, "config": dict(SMALL)}
    out.update(overrides)
    return out


def make_app(factory=None, **kw):
    factory = factory or FakeSessionFactory()
    kw.setdefault("max_sessions", 2)
    kw.setdefault("ack_timeout_s", 2.0)
    return create_stream_app(factory, **kw), factory


def create(client, **overrides) -> dict:
    r = client.post("/v1/stream/sessions", json=body(**overrides))
    assert r.status_code == 201, r.text
    return r.json()


def wait_for(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def parse_metrics(text: str) -> dict[str, float]:
    """Strict-enough Prometheus text parser: every sample belongs to a declared family and is well-formed."""
    types, samples = {}, {}
    sample = re.compile(
        r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? (\S+)$'
    )
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary"), line
            types[name] = kind
        elif line.startswith("# HELP ") or not line:
            continue
        else:
            m = sample.match(line)
            assert m, f"malformed sample line: {line!r}"
            name = m.group(1)
            family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
            assert family in types, f"sample {name} has no # TYPE"
            samples[name + (m.group(2) or "")] = float(m.group(4))
    return samples


def ws_url(base: str, session: dict) -> str:
    return "ws" + base[4:] + session["ws_path"]


# ---- HTTP ------------------------------------------------------------------------------------------------------------
def test_metadata_lists_the_models_the_cli_can_serve():
    app, _ = make_app(models=["lingbot_world_v2"])
    with TestClient(app) as client:
        assert client.get("/v1/service/metadata").json()["models"] == ["lingbot_world_v2"]


def test_health_metadata_and_metrics_format():
    app, _ = make_app()
    with TestClient(app) as client:
        health = client.get("/v1/service/health").json()
        assert health["status"] == "ok" and health["sessions_in_use"] == 0 and health["max_sessions"] == 2
        meta = client.get("/v1/service/metadata").json()
        assert meta["model"]["weights"] and meta["model"]["defaults"]["resolution"] == "832x480"
        assert meta["limits"] == {**meta["limits"], "max_sessions": 2, "delivery_mode": "lossless", "buffer_chunks": 4}
        assert "W" in meta["keys"]["allowed"] and meta["keys"]["bindings"]["J"] == "yaw_left"
        assert set(meta["config_keys"]) == {"seed", "resolution", "num_frames", "fps", "frame_policy"}
        assert meta["models"] == []
        r = client.get("/v1/service/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        m = parse_metrics(r.text)
        for name in (
            "sessions_created_total",
            "frames_generated_total",
            "frames_sent_total",
            "frames_dropped_total",
            "chunks_generated_total",
            "chunks_sent_total",
            "sessions_active",
            "queue_depth_chunks",
            "chunk_compute_seconds_count",
        ):
            assert f"telefuser_stream_{name}" in m, name
        assert m['telefuser_stream_chunk_compute_seconds_bucket{le="+Inf"}'] == 0
        assert client.get("/").headers["content-type"].startswith("text/html")
        assert client.get("/static/app.js").status_code == 200


def test_create_get_delete_frees_the_slot():
    app, fake = make_app()
    with TestClient(app) as client:
        s = create(client)
        assert s["total_chunks"] == 3 and s["total_frames"] == 45 and s["fps"] == 16 and s["resolution"] == "64x48"
        assert s["ws_url"].endswith(f"/v1/stream/sessions/{s['session_id']}/ws") and s["ws_url"].startswith("ws://")
        assert s["sse_url"].endswith("/events") and s["config"]["seed"] == 42
        assert client.get("/v1/service/health").json()["sessions_in_use"] == 1
        assert client.get(f"/v1/stream/sessions/{s['session_id']}").json()["state"] == "created"
        assert client.delete(f"/v1/stream/sessions/{s['session_id']}").status_code == 204
        assert client.get("/v1/service/health").json()["sessions_in_use"] == 0
        assert fake.open_sessions == 0 and fake.sessions[0].close_calls == 1
        assert client.delete(f"/v1/stream/sessions/{s['session_id']}").status_code == 204  # already gone: idempotent
        r = client.delete("/v1/stream/sessions/nope")
        assert r.status_code == 404 and "unknown or closed session 'nope'" in r.json()["detail"]


NOT_AN_IMAGE = base64.b64encode(b"this is plain text, not a picture").decode()


@pytest.mark.parametrize(
    "payload, status, message",
    [
        (b"{not json", 400, "malformed JSON body"),
        (b"", 400, "empty request body"),
        (b"[1, 2]", 400, "must be an object"),
        ({"image": IMAGE_B64}, 422, "'prompt' is required"),
        ({"prompt": "  ", "image": IMAGE_B64}, 422, "'prompt' is required"),
        ({"prompt": "x"}, 422, "'image' is required"),
        ({"prompt": "x", "image": "@@not base64@@"}, 400, "'image' is not valid base64"),
        ({"prompt": "x", "image": NOT_AN_IMAGE}, 400, "'image' could not be decoded"),
        (
            {"prompt": "x", "image": IMAGE_B64, "config": {"resolution": "big"}},
            422,
            "resolution must be a string 'WIDTHxHEIGHT'",
        ),
        ({"prompt": "x", "image": IMAGE_B64, "config": {"resolution": "833x480"}}, 422, "multiples of 8"),
        (
            {"prompt": "x", "image": IMAGE_B64, "config": {"num_frames": 50, "frame_policy": "strict"}},
            422,
            "is not 13 + 16k",
        ),
        ({"prompt": "x", "image": IMAGE_B64, "config": {"num_frames": 5}}, 422, "fewer than one chunk"),
        (
            {"prompt": "x", "image": IMAGE_B64, "config": {"num_frames": -1}},
            422,
            "num_frames must be a positive integer",
        ),
        ({"prompt": "x", "image": IMAGE_B64, "config": {"steps": 4}}, 422, "unknown config key(s) 'steps'"),
        ({"prompt": "x", "image": IMAGE_B64, "config": {"fps": "fast"}}, 422, "fps must be a number"),
        (  # a key of the model's own (its defaults name it), checked by the model
            {"prompt": "x", "image": IMAGE_B64, "config": {"frame_policy": "loose"}},
            422,
            "frame_policy must be one of strict, truncate, got 'loose'",
        ),
        ({"prompt": "x", "image": IMAGE_B64, "extra": 1}, 422, "unknown field(s) 'extra'"),
        ({"prompt": "x", "image": IMAGE_B64, "codec": "h264"}, 422, "'codec' must be one of"),
    ],
)
def test_create_rejects_bad_requests(payload, status, message):
    app, fake = make_app()
    with TestClient(app) as client:
        if isinstance(payload, bytes):
            r = client.post("/v1/stream/sessions", content=payload, headers={"content-type": "application/json"})
        else:
            r = client.post("/v1/stream/sessions", json=payload)
        assert r.status_code == status, r.text
        assert message in r.json()["detail"], r.json()["detail"]
        assert fake.created == 0 and client.get("/v1/service/health").json()["sessions_in_use"] == 0


def test_the_config_keys_are_the_common_ones_and_the_models_own():
    """A model takes the common keys and those its defaults name: a model without LingBot's frame_policy refuses it
    as unknown, and one with a key of its own takes that key (the model checks its value)."""
    plain = FakeSessionFactory(delay_s=0.0)
    plain.metadata["defaults"] = {k: v for k, v in plain.metadata["defaults"].items() if k != "frame_policy"}
    app, _ = make_app(factory=plain)
    with TestClient(app) as client:
        assert client.get("/v1/service/metadata").json()["config_keys"] == ["seed", "resolution", "num_frames", "fps"]
        r = client.post(
            "/v1/stream/sessions", json={"prompt": "x", "image": IMAGE_B64, "config": {"frame_policy": "strict"}}
        )
        assert r.status_code == 422 and "unknown config key(s) 'frame_policy'" in r.json()["detail"], r.text
    steered = FakeSessionFactory(delay_s=0.0)
    steered.metadata["defaults"] = {**steered.metadata["defaults"], "steer_gain": 1.0}
    app, _ = make_app(factory=steered)
    with TestClient(app) as client:
        assert client.get("/v1/service/metadata").json()["config_keys"][-1] == "steer_gain"
        body = {
            "prompt": "x",
            "image": IMAGE_B64,
            "config": {"steer_gain": 2.0, "num_frames": 13, "resolution": "64x48"},
        }
        assert client.post("/v1/stream/sessions", json=body).status_code == 201


def test_create_multipart_and_content_type_errors():
    app, fake = make_app()
    with TestClient(app) as client:
        r = client.post(
            "/v1/stream/sessions",
            data={"prompt": "harbour", "config": json.dumps({"num_frames": 13, "resolution": "64x48"})},
            files={"image": ("scene.jpg", image_bytes("JPEG"), "image/jpeg")},
        )
        assert r.status_code == 201, r.text
        assert r.json()["total_chunks"] == 1 and fake.sessions[0].prompt == "harbour"
        r = client.post("/v1/stream/sessions", data={"prompt": "x"}, files={"image": ("a.txt", b"hello", "text/plain")})
        assert r.status_code == 400 and "could not be decoded" in r.json()["detail"]
        r = client.post("/v1/stream/sessions", content=b"prompt=x", headers={"content-type": "text/plain"})
        assert r.status_code == 415 and "unsupported content type" in r.json()["detail"]
        r = client.post(
            "/v1/stream/sessions", content=b"--x\r\n", headers={"content-type": "multipart/form-data; boundary=x"}
        )
        assert r.status_code == 400 and "malformed multipart" in r.json()["detail"]


def test_over_capacity_is_429_with_a_reason():
    app, fake = make_app(max_sessions=2)
    with TestClient(app) as client:
        first, _second = create(client), create(client)
        r = client.post("/v1/stream/sessions", json=body())
        assert r.status_code == 429
        assert "all 2 session slot(s) are in use (max_sessions=2)" in r.json()["detail"]
        assert r.headers["retry-after"]
        assert fake.created == 2  # refused before the model was asked
        client.delete(f"/v1/stream/sessions/{first['session_id']}")
        create(client)
        m = parse_metrics(client.get("/v1/service/metrics").text)
        assert m['telefuser_stream_sessions_rejected_total{reason="capacity"}'] == 1


def test_unknown_session_everywhere():
    app, _ = make_app()
    with TestClient(app) as client:
        for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/events"), ("POST", "/stop")):
            r = client.request(method, f"/v1/stream/sessions/missing{path}")
            assert r.status_code == 404 and "unknown or closed session 'missing'" in r.json()["detail"], (method, path)
        with client.websocket_connect("/v1/stream/sessions/missing/ws") as ws:
            event = ws.receive_json()
            assert event["stage"] == "error" and event["fatal"] and "unknown or closed session" in event["message"]
            assert ws.receive()["code"] == 4404


# ---- WebSocket ------------------------------------------------------------------------------------------------------
def read_ws_stream(ws, on_chunk=None, sleep_s=0.0):
    """Read a whole stream with the websockets sync client; returns (headers, frames, events)."""
    headers, frames, events = [], [], []
    while True:
        msg = ws.recv()
        if isinstance(msg, bytes):
            header, images = unpack(msg)
            headers.append(header)
            frames.append(decode_frames(header, images))
            if on_chunk:
                on_chunk(header)
            time.sleep(sleep_s)  # a slow client
            continue
        event = json.loads(msg)
        events.append(event)
        if event["stage"] == "done":
            ws.send(json.dumps({"type": "delivery_ack", "published_frames": sum(len(f) for f in frames)}))
        if event["stage"] in ("delivery_ack", "closed") or event.get("fatal"):
            return headers, frames, events


def test_ws_lossless_slow_client_gets_every_chunk_exactly_once():
    from websockets.sync.client import connect

    # Incompressible raw frames (110 KiB each) make the socket buffers fill, so the slow reader really pushes back.
    fake = FakeSessionFactory(pattern="noise")
    app, _ = make_app(fake, buffer_chunks=1, codec="raw")
    with serve_in_thread(app) as base, httpx.Client(base_url=base, trust_env=False) as http:
        s = http.post(
            "/v1/stream/sessions", json=body(config={"resolution": "192x192", "num_frames": 13 + 16 * 9})
        ).json()
        with connect(ws_url(base, s), max_size=None, proxy=None) as ws:
            headers, frames, events = read_ws_stream(ws, sleep_s=0.08)
        wait_for(lambda: http.get("/v1/service/health").json()["sessions_in_use"] == 0, what="slot release")
        status = http.get(f"/v1/stream/sessions/{s['session_id']}").json()
        metrics = parse_metrics(http.get("/v1/service/metrics").text)
    assert [h["chunk"] for h in headers] == list(range(10))
    assert [h["first_frame"] for h in headers] == [0] + [13 + 16 * i for i in range(9)]
    history = fake.sessions[0].history
    received = [zlib.crc32(f.tobytes()) for chunk in frames for f in chunk]
    assert received == [c for h in history for c in h["crc32"]]  # bit-exact, in order, no gaps or duplicates
    assert [c for h in headers for c in h["crc32"]] == received
    stages = [e["stage"] for e in events]
    assert stages[0] == "runtime_ready" and stages.count("chunk_sent") == 10 and stages[-2:] == ["done", "delivery_ack"]
    done = events[-2]
    assert done["published_frames"] == sum(len(f) for f in frames) == 157 and done["chunks"] == 10
    assert events[-1]["match"] is True and status["ack_match"] is True and status["acked_frames"] == 157
    assert metrics["telefuser_stream_frames_dropped_total"] == 0
    assert metrics["telefuser_stream_frames_sent_total"] == metrics["telefuser_stream_frames_generated_total"] == 157
    assert metrics['telefuser_stream_delivery_acks_total{result="match"}'] == 1
    # The generator had to wait for the slow reader (lossless backpressure), and the queue never exceeded its bound.
    assert metrics["telefuser_stream_backpressure_seconds_total"] > 0
    assert max(e["queue_depth"] for e in events if e["stage"] == "chunk_sent") <= 1


def test_ws_jpeg_frames_carry_the_model_checksums():
    fake = FakeSessionFactory()
    app, _ = make_app(fake)
    with TestClient(app) as client:
        s = create(client)
        with client.websocket_connect(s["ws_path"]) as ws:
            chunks, events = [], []
            while True:
                msg = ws.receive()
                if msg.get("bytes") is not None:
                    chunks.append(unpack(msg["bytes"]))
                    continue
                events.append(json.loads(msg["text"]))
                if events[-1]["stage"] == "done":
                    ws.send_json({"type": "delivery_ack", "published_frames": events[-1]["published_frames"]})
                if events[-1]["stage"] == "delivery_ack":
                    break
    history = fake.sessions[0].history
    for (header, images), h in zip(chunks, history, strict=True):
        assert header["codec"] == "jpeg" and header["crc32"] == h["crc32"] and header["frames"] == len(images)
        decoded = decode_frames(header, images)
        assert decoded.shape == (h["frames"], 48, 64, 3)
    chunk_sent = [e for e in events if e["stage"] == "chunk_sent"]
    assert [e["measurement"]["index"] for e in chunk_sent] == [0, 1, 2]
    assert all(e["measurement"]["compute_seconds"] >= 0 and "denoise" in e["measurement"]["phases"] for e in chunk_sent)


def test_controls_apply_from_the_next_chunk_and_unknown_keys_are_errors():
    fake = FakeSessionFactory(delay_s=0.03)
    app, _ = make_app(fake)
    with TestClient(app) as client:
        s = create(client, config={"resolution": "64x48", "num_frames": 13 + 16 * 5})
        events = []
        with client.websocket_connect(s["ws_path"]) as ws:
            while True:
                msg = ws.receive()
                if msg.get("bytes") is not None:
                    if unpack(msg["bytes"])[0]["chunk"] == 0:
                        ws.send_json({"type": "control", "keys": ["W", "Q"]})  # rejected as a whole
                        ws.send_json({"type": "control", "keys": ["j", "W"]})
                        ws.send_json({"type": "bogus"})
                        ws.send_text("not json")
                    continue
                events.append(json.loads(msg["text"]))
                if events[-1]["stage"] == "done":
                    ws.send_json({"type": "delivery_ack", "published_frames": events[-1]["published_frames"]})
                if events[-1]["stage"] == "delivery_ack":
                    break
    errors = [e for e in events if e["stage"] == "error"]
    assert len(errors) == 3 and not any(e["fatal"] for e in errors)
    assert "unknown key 'Q'" in errors[0]["message"] and "allowed keys: W, S, A, D" in errors[0]["message"]
    assert "unknown message type 'bogus'" in errors[1]["message"] and "malformed JSON" in errors[2]["message"]
    (ack,) = [e for e in events if e["stage"] == "control_state"]
    assert ack["keys"] == ["W", "J"]
    k = ack["applies_from_chunk"]
    assert 1 <= k < 6
    history = fake.sessions[0].history
    assert [h["keys"] for h in history] == [[]] * k + [["W", "J"]] * (6 - k)
    assert [e["stage"] for e in events].count("chunk_sent") == 6 and events[-1]["match"] is True


def test_http_control_endpoint_for_sse_clients():
    app, fake = make_app(FakeSessionFactory(delay_s=0.02))
    with TestClient(app) as client:
        s = create(client)
        sid = s["session_id"]
        r = client.post(f"/v1/stream/sessions/{sid}/control", json={"keys": ["ArrowUp", "k"], "seq": 7})
        assert r.status_code == 200
        assert r.json() == {"keys": ["ArrowUp", "K"], "applies_from_chunk": 0, "generation": 1, "seq": 7}
        r = client.post(f"/v1/stream/sessions/{sid}/control", json={"keys": ["W"], "seq": -1})
        assert r.status_code == 422 and "'seq' must be an integer" in r.json()["detail"]
        r = client.post(f"/v1/stream/sessions/{sid}/control", json={"keys": ["Space"]})
        assert r.status_code == 422 and "unknown key 'Space'" in r.json()["detail"]
        r = client.post(f"/v1/stream/sessions/{sid}/ack", json={"published_frames": 3})
        assert r.status_code == 409 and "only valid after the done event" in r.json()["detail"]
        with client.stream("GET", s["sse_path"]) as resp:
            chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith('data: {"type":"chunk')]
        assert fake.sessions[0].history[0]["keys"] == ["ArrowUp", "K"]
        assert [(c["control_generation"], c["control_seq"]) for c in chunks] == [(1, 7)] * 3


def test_disconnect_mid_stream_stops_generation_and_frees_the_slot():
    from websockets.sync.client import connect

    fake = FakeSessionFactory(delay_s=0.05)
    app, _ = make_app(fake)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, trust_env=False) as http:
        s = http.post("/v1/stream/sessions", json=body(config={"resolution": "64x48", "num_frames": None})).json()
        assert s["total_chunks"] is None
        with connect(ws_url(base, s), proxy=None) as ws:
            while not isinstance(ws.recv(), bytes):
                pass  # one chunk, then hang up
        t0 = time.monotonic()
        wait_for(lambda: http.get("/v1/service/health").json()["sessions_in_use"] == 0, timeout=3, what="slot release")
        released_s = time.monotonic() - t0
        session = fake.sessions[0]
        assert session.close_calls == 1 and fake.open_sessions == 0
        generated = len(session.history)
        time.sleep(0.2)
        assert len(session.history) == generated  # generation stopped
        status = http.get(f"/v1/stream/sessions/{s['session_id']}").json()
        assert status["close_reason"] == "disconnect" and status["state"] == "closed"
    assert released_s < 1.0, released_s


def test_sse_client_going_away_frees_the_slot():
    fake = FakeSessionFactory(delay_s=0.05)
    app, _ = make_app(fake)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, trust_env=False) as http:
        s = http.post("/v1/stream/sessions", json=body(config={"resolution": "64x48", "num_frames": None})).json()
        with http.stream("GET", s["sse_path"]) as r:
            for line in r.iter_lines():
                if line.startswith("event: chunk"):
                    break
        wait_for(lambda: http.get("/v1/service/health").json()["sessions_in_use"] == 0, timeout=3, what="slot release")
        assert fake.sessions[0].close_calls == 1
        assert http.get(f"/v1/stream/sessions/{s['session_id']}").json()["close_reason"] == "disconnect"


def test_delete_while_streaming_ends_the_websocket():
    app, fake = make_app(FakeSessionFactory(delay_s=0.02))
    with TestClient(app) as client:
        s = create(client, config={"resolution": "64x48", "num_frames": None})
        with client.websocket_connect(s["ws_path"]) as ws:
            while ws.receive().get("bytes") is None:
                pass
            assert client.delete(f"/v1/stream/sessions/{s['session_id']}").status_code == 204
            stages = []
            while True:
                msg = ws.receive()
                if msg["type"] == "websocket.close":
                    break
                if msg.get("text"):
                    stages.append(json.loads(msg["text"]))
            assert stages[-1] == {"type": "status", "stage": "closed", "reason": "deleted"}
        assert fake.open_sessions == 0 and client.get("/v1/service/health").json()["sessions_in_use"] == 0


def test_second_consumer_is_refused():
    app, _ = make_app(FakeSessionFactory(delay_s=0.02))
    with TestClient(app) as client:
        s = create(client, config={"resolution": "64x48", "num_frames": None})
        with client.websocket_connect(s["ws_path"]) as ws:
            ws.receive_json()
            r = client.get(s["sse_path"])
            assert r.status_code == 409 and "already has a consumer (websocket)" in r.json()["detail"]
            with client.websocket_connect(s["ws_path"]) as ws2:
                assert "already has a consumer" in ws2.receive_json()["message"]
                assert ws2.receive()["code"] == 4409


# ---- SSE ------------------------------------------------------------------------------------------------------------
def parse_sse(lines):
    events, current = [], {}
    for line in lines:
        if line == "":
            if "data" in current:
                events.append((current.get("event", "message"), json.loads(current["data"]), current.get("id")))
            current = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            current[field] = value[1:] if value.startswith(" ") else value
    return events


def test_sse_chunks_are_lossless_checkable():
    fake = FakeSessionFactory()
    app, _ = make_app(fake)
    with TestClient(app) as client:
        s = create(client, config={"resolution": "64x48", "num_frames": 13 + 16 * 4})
        with client.stream("GET", s["sse_path"]) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = list(resp.iter_lines())
        assert lines[0].startswith(": telefuser stream")
        events = parse_sse(lines)
        kinds = [e[0] for e in events]
        assert kinds == ["chunk"] * 5 + ["done"]
        chunks = [e[1] for e in events[:-1]]
        # The AIPerf lossless checks: indices exactly 0..N-1, sum of frames == declared published_frames.
        assert [c["chunk"] for c in chunks] == list(range(5)) and [e[2] for e in events[:-1]] == [
            "0",
            "1",
            "2",
            "3",
            "4",
        ]
        done = events[-1][1]
        assert sum(c["frames"] for c in chunks) == done["published_frames"] == 77 and done["chunks"] == 5
        assert all(set(c) >= {"type", "chunk", "frames", "first_frame", "checksum", "measurement"} for c in chunks)
        history = fake.sessions[0].history
        from telefuser.serving.stream.envelope import chunk_checksum

        assert [c["checksum"] for c in chunks] == [chunk_checksum(h["crc32"]) for h in history]
        r = client.post(f"/v1/stream/sessions/{s['session_id']}/ack", json={"published_frames": 77})
        assert r.status_code == 200 and r.json()["match"] is True


def test_sse_with_frames_and_status_events():
    app, fake = make_app(FakeSessionFactory(), codec="png")
    with TestClient(app) as client:
        s = create(client, config={"resolution": "64x48", "num_frames": 29})
        with client.stream("GET", s["sse_path"] + "?frames=1&status=1") as resp:
            events = parse_sse(resp.iter_lines())
    assert [e[0] for e in events] == ["status", "chunk", "chunk", "done"]
    assert events[0][1]["stage"] == "runtime_ready"
    history = fake.sessions[0].history
    for (_, chunk, _), h in zip(events[1:3], history):
        frames = [np.asarray(Image.open(io.BytesIO(base64.b64decode(b)))) for b in chunk["images"]]
        assert [zlib.crc32(f.tobytes()) for f in frames] == h["crc32"] and chunk["codec"] == "png"


# ---- delivery modes at the session level ----------------------------------------------------------------------------
def _run_unconsumed(mode: str, buffer_chunks: int):
    """Drive a StreamSessionState with a consumer that does not read until generation has had time to finish."""
    from concurrent.futures import ThreadPoolExecutor

    async def main():
        fake = FakeSessionFactory()
        config = {**fake.defaults, "resolution": "32x32", "num_frames": 13 + 16 * 5}
        model = fake.create(np.zeros((8, 8, 3), np.uint8), "p", config)
        settings = StreamSettings(max_sessions=1, delivery_mode=mode, buffer_chunks=buffer_chunks)
        metrics = StreamMetrics()
        pool = ThreadPoolExecutor(2)
        loop = asyncio.get_running_loop()
        rt = StreamSessionState(
            "s",
            model,
            prompt="p",
            config=config,
            codec="raw",
            settings=settings,
            metrics=metrics,
            run_blocking=lambda fn, *a: loop.run_in_executor(pool, fn, *a),
            on_released=lambda r: None,
            on_closed=lambda r: None,
        )
        rt.attach("test", images=True)
        await asyncio.sleep(0.3)
        generated_while_blocked = rt.chunks_generated
        sent, done = [], None
        async for item in rt.events():
            if isinstance(item, DoneItem):
                done = rt.done_payload(item)
            else:
                rt.mark_sent(item, 0)
                sent.append(item.index)
        await rt.aclose("completed")
        pool.shutdown()
        return generated_while_blocked, sent, done, metrics, model

    return asyncio.run(main())


def test_lossless_backpressure_holds_the_generator():
    blocked_at, sent, done, metrics, model = _run_unconsumed("lossless", 1)
    # One chunk in the FIFO plus one waiting to be put: the model is not run further ahead than that.
    assert blocked_at == 2, blocked_at
    assert sent == list(range(6)) and done["published_frames"] == 13 + 16 * 5 and done["dropped_frames"] == 0
    assert metrics.value("frames_dropped_total") == 0 and metrics.value("backpressure_seconds_total") > 0.2
    assert model.close_calls == 1


def test_realtime_mode_never_runs_past_the_buffer_nor_drops():
    # bounded playout: with nothing delivered the generator stops at the announced buffer, and nothing is dropped
    blocked_at, sent, done, metrics, _ = _run_unconsumed("realtime", 1)
    assert blocked_at == 1, blocked_at
    assert sent == list(range(6)) and done["dropped_frames"] == 0 and done["published_frames"] == 13 + 16 * 5
    assert metrics.value("frames_dropped_total") == 0 and metrics.value("playout_wait_seconds_total") > 0.2


# ---- teardown -------------------------------------------------------------------------------------------------------
def test_lifespan_shutdown_closes_open_sessions():
    fake = FakeSessionFactory(delay_s=0.02)
    app, _ = make_app(fake)
    with TestClient(app) as client:
        idle = create(client)
        streaming = create(client, config={"resolution": "64x48", "num_frames": None})
        r = client.post(f"/v1/stream/sessions/{streaming['session_id']}/control", json={"keys": []})
        assert r.status_code == 200

        def read_sse():
            try:
                client.get(streaming["sse_path"])
            except Exception:
                pass  # the TestClient goes away under the stream: that is the point

        threading.Thread(target=read_sse, daemon=True).start()
        wait_for(lambda: fake.sessions[1].history, what="streaming")
    assert fake.open_sessions == 0 and all(s.close_calls == 1 for s in fake.sessions)
    assert idle["session_id"] != streaming["session_id"]


def test_idle_sessions_are_reaped():
    app, fake = make_app(idle_timeout_s=0.3)
    with TestClient(app) as client:
        s = create(client)
        wait_for(lambda: fake.open_sessions == 0, timeout=3, what="idle reaping")
        assert client.get(f"/v1/stream/sessions/{s['session_id']}").json()["close_reason"] == "idle"


def test_create_delete_200_sessions_does_not_leak(record_property):
    fake = FakeSessionFactory(keep_sessions=False)
    app, _ = make_app(fake, max_sessions=1)
    with TestClient(app) as client:

        def cycle(stream: bool):
            s = create(client)
            if stream:  # every 4th session also streams a chunk over the WebSocket first
                with client.websocket_connect(s["ws_path"]) as ws:
                    while ws.receive().get("bytes") is None:
                        pass
            assert client.delete(f"/v1/stream/sessions/{s['session_id']}").status_code == 204

        for i in range(30):  # warm-up: allocator pools, thread pool, imports
            cycle(i % 4 == 0)
        before = hv.rss_bytes()
        t0 = time.monotonic()
        for i in range(200):
            cycle(i % 4 == 0)
        elapsed = time.monotonic() - t0
        after = hv.rss_bytes()
        health = client.get("/v1/service/health").json()
    growth_mb = (after - before) / 2**20
    record_property("rss_growth_mb", round(growth_mb, 2))
    print(f"\n200 sessions: RSS growth {growth_mb:.2f} MB in {elapsed:.1f}s")
    assert health["sessions_in_use"] == 0 and health["sessions_live"] == 0
    assert fake.open_sessions == 0 and fake.created == 230
    assert growth_mb < 20, f"RSS grew {growth_mb:.1f} MB over 200 sessions"


def test_serve_stream_ctrl_c_shuts_down_cleanly():
    from websockets.sync.client import connect

    command = [sys.executable, "-m", "telefuser.serving.stream.cli", "serve-stream", "--fake", "--port", "0",
               "--resolution", "64x48", "--fake-delay", "0.05", "--max-sessions", "2", "--log-level", "info"]  # fmt: skip
    with ServerProcess(command) as server:
        base = server.wait_url(30)
        with httpx.Client(base_url=base, trust_env=False) as http:
            ws_session = http.post("/v1/stream/sessions", json=body(config={"num_frames": None})).json()
            sse_session = http.post("/v1/stream/sessions", json=body(config={"num_frames": None})).json()
            sse_lines: list[str] = []

            def read_sse():
                with (
                    httpx.Client(trust_env=False, timeout=30) as c,
                    c.stream("GET", base + sse_session["sse_path"]) as r,
                ):
                    sse_lines.extend(r.iter_lines())

            sse = threading.Thread(target=read_sse, daemon=True)
            sse.start()
            ws_messages: list = []

            extensions: list = []

            def read_ws():  # keep draining, as a browser would, until the server closes the socket
                with connect(ws_url(base, ws_session), proxy=None) as ws:  # offers permessage-deflate, as browsers do
                    extensions.append(ws.response.headers.get("Sec-WebSocket-Extensions"))
                    try:
                        while True:
                            ws_messages.append(ws.recv(timeout=20))
                    except Exception as exc:
                        ws_messages.append(exc)

            ws_reader = threading.Thread(target=read_ws, daemon=True)
            ws_reader.start()
            wait_for(lambda: any(isinstance(m, bytes) for m in ws_messages), what="ws chunk")
            wait_for(lambda: any(line.startswith("event: chunk") for line in sse_lines), what="sse chunk")
            server.send(signal.SIGINT)
            ws_reader.join(timeout=15)
        assert server.wait(15) == 0, server.log
        sse.join(timeout=5)
    log = server.log
    assert "stream service stopped: closed 2 session(s)" in log, log
    assert "serve-stream exited cleanly" in log and "Traceback" not in log, log
    events = [json.loads(m) for m in ws_messages if isinstance(m, str)]
    assert events[-1] == {"type": "status", "stage": "closed", "reason": "shutdown"}, (events[-3:], ws_messages[-1])
    assert getattr(ws_messages[-1], "rcvd", None) is not None and ws_messages[-1].rcvd.code == 1001
    assert "event: closed" in sse_lines
    assert extensions == [None]  # no deflate negotiated: JPEG frames do not shrink, and it costs time per chunk
