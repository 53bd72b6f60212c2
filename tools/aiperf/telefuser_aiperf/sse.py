"""An incremental Server-Sent Events parser that stamps every event with its arrival time. No aiperf imports.

The service's SSE stream (`GET /v1/stream/sessions/{id}/events`, see telefuser/serving/stream/PROTOCOL.md) sends one event per
chunk. Bytes arrive in arbitrary pieces; `SSEParser.feed(data, perf_ns)` returns the events completed by this piece,
each stamped with the arrival time of the piece that completed it (the moment a client could act on it), which is
what per-chunk timing needs. Comments (`: keep-alive`) are returned as events with `comment` set so that callers can
ignore them explicitly; they are never chunks.

Parsing follows the WHATWG event-stream rules closely enough for this service: lines end in LF, CRLF or CR; a blank
line dispatches; `field: value` strips one leading space from the value; several `data:` lines join with LF; a line
without a colon is a field with an empty value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SSEEvent:
    perf_ns: int
    event: str = "message"
    data: str = ""
    id: str | None = None
    comment: str | None = None
    fields: list[tuple[str, str]] = field(default_factory=list)  # in order, for re-export

    @property
    def is_comment(self) -> bool:
        return self.comment is not None and not self.fields

    def json(self) -> Any:
        """The data as JSON; ValueError with the event name when it is not JSON."""
        try:
            return json.loads(self.data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"SSE event {self.event!r} carries non-JSON data: {self.data[:120]!r}") from exc


class SSEParser:
    def __init__(self) -> None:
        self._buffer = ""
        self._pending_cr = False
        self._reset()

    def _reset(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None
        self._comment: str | None = None
        self._fields: list[tuple[str, str]] = []

    def feed(self, data: bytes | str, perf_ns: int) -> list[SSEEvent]:
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF split across two pieces
        self._pending_cr = text.endswith("\r")
        self._buffer += text
        out: list[SSEEvent] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                break
            line, self._buffer = self._buffer[: cut[0]], self._buffer[cut[1] :]
            event = self._line(line, perf_ns)
            if event is not None:
                out.append(event)
        return out

    def close(self, perf_ns: int) -> list[SSEEvent]:
        """End of stream: a trailing event without its blank line is still delivered."""
        out = []
        if self._buffer:
            line, self._buffer = self._buffer, ""
            event = self._line(line, perf_ns)
            if event is not None:
                out.append(event)
        event = self._dispatch(perf_ns)
        if event is not None:
            out.append(event)
        return out

    def _line(self, line: str, perf_ns: int) -> SSEEvent | None:
        if line == "":
            return self._dispatch(perf_ns)
        if line.startswith(":"):
            text = line[1:].lstrip(" ")
            self._comment = text if self._comment is None else f"{self._comment}\n{text}"
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        self._fields.append((name, value))
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None

    def _dispatch(self, perf_ns: int) -> SSEEvent | None:
        if not self._fields and self._comment is None:
            return None
        event = SSEEvent(
            perf_ns=perf_ns,
            event=self._event or "message",
            data="\n".join(self._data),
            id=self._id,
            comment=self._comment,
            fields=self._fields,
        )
        self._reset()
        return event


def _line_end(buffer: str) -> tuple[int, int] | None:
    """(end of line, start of next line) of the first complete line, or None (str.find: events can be megabytes)."""
    lf, cr = buffer.find("\n"), buffer.find("\r")
    if lf == -1 and cr == -1:
        return None
    if cr == -1 or (lf != -1 and lf < cr):
        return lf, lf + 1
    if cr + 1 < len(buffer) and buffer[cr + 1] == "\n":
        return cr, cr + 2
    return cr, cr + 1  # a lone CR; if it ended the piece, feed() drops the LF that may follow
