"""Optional API keys on both services: off by default; when set, `Authorization: Bearer` on every route but health
(and the stream service's page), a WebSocket / SSE query token, 401 that says what to send, request ids."""

from __future__ import annotations

import base64
import io
import json
import logging

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from starlette.testclient import WebSocketDenialResponse

from telefuser.serving.common.auth import ENV_VAR, ApiKeys, RedactTokens, keys_from_args
from telefuser.serving.common.launch import _loopback
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.fake import FakeSessionFactory
from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.fake import FakeVideoRunner

KEY, OTHER = "tf-test-key-0123456789", "second-key"


def _image() -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


BODY = {"prompt": "harbour", "image": _image(), "config": {"resolution": "64x48", "num_frames": 29}}
AUTH = {"Authorization": f"Bearer {KEY}"}


def test_keys_come_from_flags_and_the_environment():
    assert not ApiKeys.from_sources(None, environ={}).enabled
    keys = ApiKeys.from_sources([KEY], environ={ENV_VAR: f" {OTHER}\n"})
    assert keys.enabled and keys.count == 2
    assert keys.matches(KEY) and keys.matches(OTHER) and not keys.matches(KEY[:-1]) and not keys.matches(None)
    assert not keys.matches(KEY + "x") and not keys.matches("") and not keys.matches("\ud800")
    for bad in ("", "has space", "tab\tkey"):
        with pytest.raises(ValueError, match="printable text without spaces"):
            ApiKeys([bad])
    import argparse

    with pytest.raises(SystemExit, match="--api-key / TELEFUSER_API_KEY"):
        keys_from_args(argparse.Namespace(api_key=["bad key"]))


def test_the_cli_takes_repeatable_keys():
    from telefuser.cli import build_parser

    args = build_parser().parse_args(["serve", "--fake", "--api-key", KEY, "--api-key", OTHER])
    assert args.api_key == [KEY, OTHER] and args.host == "127.0.0.1"
    args = build_parser().parse_args(["serve-stream", "--fake", "--api-key", KEY])
    assert args.api_key == [KEY] and args.host == "127.0.0.1"
    assert build_parser().parse_args(["serve", "--fake"]).api_key is None  # default: off


def test_stream_service_requires_the_key_everywhere_but_health_and_the_page():
    app = create_stream_app(FakeSessionFactory(), max_sessions=2, api_keys=ApiKeys([KEY, OTHER]))
    with TestClient(app) as client:
        assert client.get("/v1/service/health").status_code == 200
        assert client.get("/").status_code == 200 and client.get("/static/app.js").status_code == 200
        r = client.get("/v1/service/metadata")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert "send the header 'Authorization: Bearer <API key>'" in r.json()["detail"]
        assert "?token=" in r.json()["detail"] and r.headers["x-request-id"]
        r = client.get("/v1/service/metadata", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["detail"] == "invalid API key"
        r = client.get("/v1/service/metadata", headers={"Authorization": KEY})
        assert r.status_code == 401 and "must be 'Bearer <API key>'" in r.json()["detail"]
        for path in ("/v1/service/metrics", "/v1/stream/sessions", "/v1/stream/sessions/x", "/nowhere"):
            assert client.get(path).status_code == 401, path
        assert client.post("/v1/stream/sessions", json=BODY).status_code == 401
        meta = client.get("/v1/service/metadata", headers={"Authorization": f"bearer {OTHER}"})
        assert meta.status_code == 200 and meta.json()["auth"]["api_key_required"] is True

        s = client.post("/v1/stream/sessions", json=BODY, headers=AUTH).json()
        token = s["ws_path"].split("?token=")[1]
        assert s["sse_path"].endswith(f"?token={token}") and s["ws_url"].endswith(f"/ws?token={token}")
        sid = s["session_id"]
        assert client.get(f"/v1/stream/sessions/{sid}?token={token}").status_code == 401  # only the streams take it
        assert client.post(f"/v1/stream/sessions/{sid}/control", json={"keys": ["W"]}, headers=AUTH).status_code == 200

        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect(f"/v1/stream/sessions/{sid}/ws"),
        ):
            pass
        assert refused.value.status_code == 401 and "API key" in refused.value.json()["detail"]
        with pytest.raises(WebSocketDenialResponse), client.websocket_connect(f"/v1/stream/sessions/{sid}/ws?token=no"):
            pass
        other = client.post("/v1/stream/sessions", json=BODY, headers=AUTH).json()
        crossed = other["ws_path"].replace(other["session_id"], sid)  # one session's token, another session's stream
        with pytest.raises(WebSocketDenialResponse), client.websocket_connect(crossed):
            pass
        with client.websocket_connect(s["ws_path"]) as ws:  # the token from the create reply: what the page does
            assert ws.receive_json()["stage"] == "runtime_ready"
        assert client.delete(f"/v1/stream/sessions/{sid}", headers=AUTH).status_code == 204

        with client.stream("GET", other["sse_path"]) as resp:  # SSE with the query token
            assert resp.status_code == 200
            events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1]["type"] == "done"
        third = client.post("/v1/stream/sessions", json=BODY, headers=AUTH).json()
        bare = third["sse_path"].split("?")[0]
        assert client.get(bare).status_code == 401
        with client.stream("GET", bare, headers=AUTH) as resp:  # ... or the bearer header
            assert resp.status_code == 200 and list(resp.iter_lines())
        with client.stream("GET", bare + f"?token={KEY}") as resp:  # ... or the key as the token (closed by now)
            assert resp.status_code in (200, 404, 409)


def test_stream_urls_carry_no_token_when_keys_are_off():
    with TestClient(create_stream_app(FakeSessionFactory())) as client:
        s = client.post("/v1/stream/sessions", json=BODY).json()
        assert "token" not in s["ws_path"] and "token" not in s["sse_url"]
        assert client.get("/v1/service/metadata").json()["auth"]["api_key_required"] is False


def test_video_service_requires_the_key_everywhere_but_health(tmp_path):
    app = create_video_app(FakeVideoRunner(), output_dir=tmp_path, api_keys=ApiKeys([KEY]))
    with TestClient(app) as client:
        assert client.get("/v1/service/health").status_code == 200
        for method, path in (("GET", "/v1/models"), ("GET", "/v1/videos"), ("POST", "/v1/videos"),
                             ("GET", "/v1/videos/video_x"), ("GET", "/v1/videos/video_x/content"),
                             ("DELETE", "/v1/videos/video_x"), ("GET", "/v1/service/metadata"),
                             ("GET", "/v1/service/metrics")):  # fmt: skip
            r = client.request(method, path)
            assert r.status_code == 401 and "Authorization: Bearer" in r.json()["detail"], (method, path)
        assert client.get("/v1/videos?token=" + KEY).status_code == 401  # no query tokens here
        r = client.post("/v1/videos", json={"prompt": "p"}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert client.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == "MiniMax-H3"


def test_access_logs_hide_tokens_and_exposure_is_recognised():
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        "",
        0,
        '%s - "%s %s HTTP/%s" %d',
        ("1.2.3.4", "GET", "/v1/x/events?frames=1&token=s3cr3t", "1.1", 200),
        None,
    )
    assert RedactTokens().filter(record) and "s3cr3t" not in record.getMessage()
    assert "token=<redacted>" in record.getMessage() and "frames=1" in record.getMessage()
    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("localhost")
    assert not _loopback("0.0.0.0") and not _loopback("10.0.0.2") and not _loopback("example.org")
