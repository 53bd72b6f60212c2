"""What a new user reads (issue 36): `serve-stream --help` with every option's default, and a session's start and end
lines in the log."""

from __future__ import annotations

import argparse
import logging
import re

from fastapi.testclient import TestClient

from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.cli import add_serve_stream_parser
from telefuser.serving.stream.fake import FakeSessionFactory
from tests.unit.test_stream_service import body


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="telefuser")
    add_serve_stream_parser(parser.add_subparsers())
    return parser._subparsers._group_actions[0].choices["serve-stream"]


def _help() -> str:
    return re.sub(r"\s+", " ", _parser().format_help())


def test_help_shows_every_default():
    text = _help()
    for expected in (
        "--port PORT the port",
        "(default: 8088)",
        "queue's length (default: 4)",
        "interactive) (default: lossless)",
        "names none (default: jpeg)",
        "--jpeg-quality JPEG_QUALITY JPEG quality of the envelope's frames, 1-95 (default: 85)",
        "delivery_ack (default: 10.0)",
        "within this (default: 120.0)",
        "(the image is in it) (default: 32.0)",
        "--webrtc-codec {vp8,h264} video codec, encoded with PyAV (default: vp8)",
        "bitrate cap, Mbit/s (default: 8.0)",
        "(default: the model's, 16)",
    ):
        assert expected in text, expected
    # every option that takes a value says what it defaults to
    parser = _parser()
    formatter = parser.formatter_class(prog="telefuser serve-stream")
    for action in parser._actions:
        if action.option_strings and action.nargs != 0:
            text = formatter._get_help_string(action).lower()
            assert any(w in text for w in ("default", "repeatable", "when omitted")), (action.option_strings, text)


def test_a_session_logs_its_start_and_its_end(caplog):
    app = create_stream_app(FakeSessionFactory(), max_sessions=1, ack_timeout_s=0.5)
    with caplog.at_level(logging.INFO, logger="telefuser.serving"), TestClient(app) as client:
        session = client.post("/v1/stream/sessions", json=body()).json()
        with client.stream("GET", session["sse_path"]) as response:
            lines = list(response.iter_lines())
        assert any(line.startswith("event: done") for line in lines)
        client.post(f"/v1/stream/sessions/{session['session_id']}/ack", json={"published_frames": 45})
        unused = client.post("/v1/stream/sessions", json=body()).json()
        client.delete(f"/v1/stream/sessions/{unused['session_id']}")
    sid = session["session_id"]
    messages = [r.getMessage() for r in caplog.records]
    started = [m for m in messages if m.startswith(f"session {sid}: started")]
    ended = [m for m in messages if m.startswith(f"session {sid}: ended")]
    assert started == [f"session {sid}: started (sse, 64x48 at 16 fps, 45 frames, lossless delivery, buffer 4 chunks)"]
    assert len(ended) == 1 and re.match(
        rf"session {sid}: ended \(completed\) after [0-9.]+ s: 3 chunks, 45 frames generated \([0-9.]+ FPS\), "
        r"45 sent \([0-9.]+ FPS\), [0-9.]+ s waiting for the viewer$",
        ended[0],
    ), ended
    assert f"session {unused['session_id']}: ended (deleted) before a consumer attached" in messages
