"""One stream session as one benchmark request: options and the client-side state machine. No aiperf imports.

`split_options` turns AIPerf's extra inputs (`--extra-inputs` / `endpoint.extra`, then the dataset row's `extra`)
into the three things a session needs:

  * the `config` of `POST /v1/stream/sessions` (seed, resolution, num_frames, fps, frame_policy),
  * other wire fields (codec),
  * harness options that never go on the wire (lossless, controls, warmup_chunks, ...; see HARNESS_DEFAULTS).

`StreamSession` consumes the service's answers and SSE events in order and knows, at the end, whether the session was
lossless (lossless.check_session) and what to acknowledge. The aiperf transport (transport.py) does the I/O around it;
the post-run checker (artifacts.py) feeds the same events from the raw export through the same class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .controls import ControlStep, chunk_steps, parse_controls, timed_steps
from .lossless import ChunkObservation, check_ack, check_session
from .sse import SSEEvent

CONFIG_KEYS = ("seed", "resolution", "num_frames", "fps", "frame_policy")
WIRE_KEYS = ("codec",)
HARNESS_DEFAULTS: dict[str, Any] = {
    "lossless": True,  # check every criterion of lossless.py, fail the request otherwise, and ack the frames
    "controls": None,  # a control trace (controls.py): path, JSON text or list
    "warmup_chunks": 1,  # chunks left out of the steady compute FPS (the first chunk carries one-time work)
    "target_fps": None,  # playback target, reported beside the measured FPS (default: config fps)
    "frames_in_events": False,  # ask for the encoded frames in each chunk event (?frames=1) and count them
    "status_events": True,  # ask for status events (?status=1): control_state answers give control latency
    "stall_timeout_s": 300.0,  # longest silence on the event stream (keep-alives count) before giving up
    "delete_session": False,  # also DELETE a session that ended normally (one that did not is always deleted)
}
_BOOL_KEYS = {"lossless", "frames_in_events", "status_events", "delete_session"}
_FLOAT_KEYS = {"stall_timeout_s", "target_fps"}


def _coerce(key: str, value: Any) -> Any:
    """--extra-inputs values may arrive as strings; give them the type the key needs."""
    if value is None:
        return None
    if key in _BOOL_KEYS:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(value, int):
            return bool(value)
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if key in _FLOAT_KEYS:
        return float(value)
    if key in ("warmup_chunks", "num_frames", "seed"):
        if isinstance(value, bool):
            raise ValueError(f"{key} must be an integer, got {value!r}")
        if isinstance(value, str):
            value = value.strip()
            if key == "num_frames" and value.lower() in ("null", "none"):
                return None
        number = int(value)
        if number != float(value):
            raise ValueError(f"{key} must be an integer, got {value!r}")
        return number
    if key == "fps":
        return float(value) if not isinstance(value, (int, float)) else value
    return value


@dataclass
class SessionOptions:
    config: dict[str, Any]
    wire: dict[str, Any]
    harness: dict[str, Any]
    controls: list[ControlStep] = field(default_factory=list)

    @property
    def requested_frames(self) -> int | None:
        return self.config.get("num_frames")

    def body(self, prompt: str, image: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": prompt, "image": image, "config": dict(self.config)}
        body.update(self.wire)
        return body

    def events_query(self) -> str:
        query = []
        if self.harness["frames_in_events"]:
            query.append("frames=1")
        if self.harness["status_events"]:
            query.append("status=1")
        return ("?" + "&".join(query)) if query else ""


def split_options(
    *sources: Iterable[tuple[str, Any]] | Mapping[str, Any] | None, base_dir: Path | None = None
) -> SessionOptions:
    """Merge option sources left to right (later wins) and split them; ValueError names an unknown key."""
    merged: dict[str, Any] = {}
    for source in sources:
        if source:
            merged.update(dict(source.items() if isinstance(source, Mapping) else source))
    nested = merged.pop("config", None)  # a row may also carry {"config": {...}}
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise ValueError(f"'config' must be an object, got {nested!r}")
        merged = {**nested, **merged}
    unknown = sorted(set(merged) - set(CONFIG_KEYS) - set(WIRE_KEYS) - set(HARNESS_DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown telefuser_stream option(s) {unknown}; config: {', '.join(CONFIG_KEYS)}; wire: "
            f"{', '.join(WIRE_KEYS)}; harness: {', '.join(HARNESS_DEFAULTS)}"
        )
    config = {k: _coerce(k, merged[k]) for k in CONFIG_KEYS if k in merged}
    wire = {k: merged[k] for k in WIRE_KEYS if k in merged and merged[k] is not None}
    harness = dict(HARNESS_DEFAULTS)
    harness.update({k: _coerce(k, merged[k]) for k in HARNESS_DEFAULTS if k in merged})
    if harness["warmup_chunks"] < 0:
        raise ValueError("warmup_chunks must be >= 0")
    controls = parse_controls(harness["controls"], base_dir=base_dir)
    return SessionOptions(config=config, wire=wire, harness=harness, controls=controls)


@dataclass
class ControlResult:
    step: ControlStep
    sent_ns: int
    answered_ns: int | None = None
    status: int | None = None
    answer: Any = None
    state_ns: int | None = None  # when the matching control_state status event arrived

    def as_dict(self, start_ns: int) -> dict[str, Any]:
        ms = lambda t: None if t is None else round((t - start_ns) / 1e6, 3)
        return {
            "number": self.step.number,
            "keys": list(self.step.keys),
            "delay_s": self.step.delay_s,
            "after_chunk": self.step.after_chunk,
            "sent_ms": ms(self.sent_ns),
            "answered_ms": ms(self.answered_ns),
            "status": self.status,
            "answer": self.answer,
            "state_event_ms": ms(self.state_ns),
        }


class StreamSession:
    """Client-side state of one session, fed in order: `created(...)`, then `on_event(...)` per SSE event."""

    def __init__(self, options: SessionOptions, start_ns: int):
        self.options = options
        self.start_ns = start_ns
        self.session_id: str | None = None
        self.create_answer: dict[str, Any] | None = None
        self.chunks: list[ChunkObservation] = []
        self.done: dict[str, Any] | None = None
        self.done_ns: int | None = None
        self.status_events: list[tuple[int, dict[str, Any]]] = []
        self.service_errors: list[str] = []
        self.end_reason: str | None = None  # set when the stream ended abnormally
        self.controls: list[ControlResult] = []
        self.ack_answer: dict[str, Any] | None = None
        self.ack_problems: list[str] = []

    # ---- inputs ----------------------------------------------------------------------------------------------------
    def created(self, answer: dict[str, Any]) -> None:
        if not isinstance(answer, dict) or not isinstance(answer.get("session_id"), str):
            raise ValueError(f"create answer without a session_id: {answer!r}")
        self.create_answer = answer
        self.session_id = answer["session_id"]

    def on_event(self, event: SSEEvent) -> str:
        """Returns the kind: comment, chunk, done, status, error, fatal, closed or ignored."""
        if event.is_comment:
            return "comment"
        kind = event.event
        if kind == "chunk":
            self.chunks.append(ChunkObservation.from_event(event.json(), event.perf_ns))
            return "chunk"
        if kind == "done":
            self.done, self.done_ns = event.json(), event.perf_ns
            return "done"
        if kind == "status":
            data = event.json()
            self.status_events.append((event.perf_ns, data))
            if data.get("stage") == "control_state":
                for result in self.controls:
                    if result.state_ns is None and list(result.step.keys) == list(data.get("keys") or []):
                        result.state_ns = event.perf_ns
                        break
            return "status"
        if kind == "error":
            data = event.json()
            message = data.get("message") or data
            if data.get("fatal", True):
                self.end_reason = f"the service ended the stream with an error: {message}"
                return "fatal"
            self.service_errors.append(f"the service reported an error: {message}")
            return "error"
        if kind == "closed":
            data = event.json()
            self.end_reason = f"the service closed the stream (reason {data.get('reason')!r}) before done"
            return "closed"
        return "ignored"

    def stream_ended(self, reason: str) -> None:
        """The connection ended (or failed) before done."""
        if self.done is None and self.end_reason is None:
            self.end_reason = reason

    # ---- controls --------------------------------------------------------------------------------------------------
    @property
    def first_chunk_ns(self) -> int | None:
        return self.chunks[0].perf_ns if self.chunks else None

    def timed_controls(self) -> list[ControlStep]:
        return timed_steps(self.options.controls)

    def controls_after_chunk(self, index: int) -> list[ControlStep]:
        return chunk_steps(self.options.controls, index)

    def control_sent(self, step: ControlStep, sent_ns: int) -> ControlResult:
        result = ControlResult(step=step, sent_ns=sent_ns)
        self.controls.append(result)
        return result

    # ---- results ---------------------------------------------------------------------------------------------------
    @property
    def counted_frames(self) -> int:
        return sum(c.frames for c in self.chunks)

    @property
    def expected_chunks(self) -> int | None:
        value = (self.create_answer or {}).get("total_chunks")
        return value if isinstance(value, int) else None

    def lossless_problems(self) -> list[str]:
        answer = self.create_answer or {}
        problems = check_session(
            self.chunks,
            self.done,
            requested_frames=self.options.requested_frames,
            expected_chunks=self.expected_chunks,
            declared_frames=answer.get("total_frames") if isinstance(answer.get("total_frames"), int) else None,
            end_reason=self.end_reason,
        )
        problems += self.service_errors
        for result in self.controls:
            if result.status is None or not (200 <= result.status < 300):
                problems.append(f"{result.step.describe()} failed: status {result.status}, answer {result.answer!r}")
        return problems

    def record_ack(self, answer: dict[str, Any] | None, status: int | None) -> list[str]:
        self.ack_answer = answer
        if status is not None and not (200 <= status < 300):
            self.ack_problems = [f"delivery ack refused: status {status}, answer {answer!r}"]
        else:
            self.ack_problems = check_ack(answer, self.counted_frames)
        return self.ack_problems

    def problems(self) -> list[str]:
        return self.lossless_problems() + self.ack_problems

    def skipped_controls(self) -> list[ControlStep]:
        sent = {r.step.number for r in self.controls}
        return [s for s in self.options.controls if s.number not in sent]

    def report(self) -> dict[str, Any]:
        """What the transport stores beside the events (raw export), for the post-run checker and for people."""
        return {
            "session_id": self.session_id,
            "requested_frames": self.options.requested_frames,
            "config": self.options.config,
            "harness": {k: v for k, v in self.options.harness.items() if k != "controls"},
            "chunks_received": len(self.chunks),
            "frames_received": self.counted_frames,
            "done": self.done,
            "end_reason": self.end_reason,
            "controls": [r.as_dict(self.start_ns) for r in self.controls],
            "controls_skipped": [s.describe() for s in self.skipped_controls()],
            "ack": self.ack_answer,
            "problems": self.problems() if self.options.harness["lossless"] else [],
        }
