"""Messages a client sends on the WebSocket: control, delivery_ack, stop. Bad ones become non-fatal error events."""

from __future__ import annotations

import json

from .protocol import normalize_keys
from .session import SessionRuntime, StateError


def handle_client_message(runtime: SessionRuntime, text: str) -> None:
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as exc:
        runtime.client_error(f"malformed JSON message: {exc}")
        return
    if not isinstance(msg, dict):
        runtime.client_error(f"a message must be a JSON object, got {type(msg).__name__}")
        return
    kind = msg.get("type")
    try:
        if kind == "control":
            try:
                keys = normalize_keys(msg.get("keys"))
            except ValueError as exc:
                runtime.client_error(f"control rejected: {exc}")
                return
            runtime.set_controls(keys)
        elif kind == "delivery_ack":
            frames = msg.get("published_frames")
            if not isinstance(frames, int) or isinstance(frames, bool) or frames < 0:
                runtime.client_error(f"delivery_ack needs a non-negative integer 'published_frames', got {frames!r}")
                return
            runtime.record_ack(frames)
        elif kind == "stop":
            runtime.request_stop()
        else:
            runtime.client_error(f"unknown message type {kind!r}; expected 'control', 'delivery_ack' or 'stop'")
    except StateError as exc:
        runtime.client_error(str(exc))
