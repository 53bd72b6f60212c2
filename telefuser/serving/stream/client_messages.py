"""Messages a client sends on the WebSocket (or the WebRTC data channel): control, playout, delivery_ack, stop. Bad
ones become non-fatal error events.

A message is bounded in size, parsed with the request-body rules and rate-limited per connection (`RATE`, `BURST`;
the excess is dropped unread and counted). Nothing a client sends here can end the stream or reach the model except
a valid control.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..common.http_errors import RequestError
from ..common.request_body import parse_json
from .contract import check_client_keys
from .session import StreamSessionState, StateError

MAX_MESSAGE_BYTES = 4096  # a control with every key is ~150 bytes
RATE, BURST = 30.0, 60  # messages per second, and at once (the page reports playout at most 10 times a second)
MAX_COUNT = 2**53 - 1  # seq and frame counts: integers a JavaScript client keeps exactly


class MessageBudget:
    """A token bucket: `take()` is True while the client stays within RATE messages a second (BURST at once)."""

    def __init__(self, rate: float = RATE, burst: int = BURST, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.last = float(burst), clock()
        self.dropped = 0
        self._warned_at: float | None = None

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.dropped += 1
        return False

    def should_warn(self) -> bool:
        """True at most once a second while messages are being dropped."""
        now = self.clock()
        if self._warned_at is None or now - self._warned_at >= 1.0:
            self._warned_at = now
            return True
        return False


def receive_client_message(
    state: StreamSessionState, message: dict, budget: MessageBudget, *, playout_reports: bool = True
) -> None:
    """One ASGI websocket.receive message (text or bytes) from the client; `playout_reports=False` refuses `playout`
    (WebRTC, where the server's video track is the playout clock)."""
    if not budget.take():
        state.metrics.inc("client_messages_dropped_total")
        if budget.should_warn():
            state.client_error(
                f"too many messages: at most {RATE:g} a second ({BURST} at once); the excess is dropped unread"
            )
        return
    text = message.get("text")
    if text is None:
        state.client_error("binary messages are not accepted; send JSON text")
        return
    if len(text) > MAX_MESSAGE_BYTES:  # characters; the server's frame limit bounds the bytes
        state.client_error(f"message of {len(text)} characters ignored; the limit is {MAX_MESSAGE_BYTES}")
        return
    handle_client_message(state, text, playout_reports=playout_reports)


def handle_client_message(state: StreamSessionState, text: str, *, playout_reports: bool = True) -> None:
    try:
        msg = parse_json(text, what="JSON message")
    except RequestError as exc:
        state.client_error(exc.detail)
        return
    if not isinstance(msg, dict):
        state.client_error(f"a message must be a JSON object, got {type(msg).__name__}")
        return
    kind = msg.get("type")
    try:
        if kind == "control":
            try:
                keys = check_client_keys(msg.get("keys"), state.settings.keys)
                seq = _count(msg, "seq", required=False)
            except ValueError as exc:
                state.client_error(f"control rejected: {exc}")
                return
            state.set_controls(keys, seq)
        elif kind == "playout" and not playout_reports:
            state.client_error("playout reports are not taken here: the server's video track is the playout clock")
        elif kind == "playout":
            try:
                played = _count(msg, "frames_played", required=True)
                buffered = _count(msg, "frames_buffered", required=False)
            except ValueError as exc:
                state.client_error(f"playout report rejected: {exc}")
                return
            state.record_playout(played, buffered)
        elif kind == "delivery_ack":
            frames = msg.get("published_frames")
            if not isinstance(frames, int) or isinstance(frames, bool) or frames < 0:
                state.client_error(
                    f"delivery_ack needs a non-negative integer 'published_frames', got {repr(frames)[:40]}"
                )
                return
            state.record_ack(frames)
        elif kind == "stop":
            state.request_stop()
        else:
            state.client_error(
                f"unknown message type {repr(kind)[:40]}; expected 'control', 'playout', 'delivery_ack' or 'stop'"
            )
    except StateError as exc:
        state.client_error(str(exc))


def _count(msg: dict, name: str, *, required: bool) -> int | None:
    """A non-negative integer field (`seq`, frame counts); None when optional and absent."""
    value = msg.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"'{name}' must be an integer in [0, 2**53), got {repr(value)[:40]}")
    return value
