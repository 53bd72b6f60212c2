"""Pairs each binary chunk envelope (TFCH: header + encoded frames) with the `chunk_sent` event that follows it, checks
that the two agree, and turns the pair into the chunk event the session state machine counts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from telefuser.serving.stream.envelope import chunk_checksum, unpack
from tools.aiperf.telefuser_aiperf.sse import SSEEvent


@dataclass
class Envelope:
    header: dict[str, Any]
    images: list[bytes]
    arrived_ns: int

    @property
    def index(self) -> Any:
        return self.header.get("chunk")


@dataclass
class PairedChunk:
    index: int
    event: SSEEvent  # a `chunk` event, stamped with the envelope's arrival
    info: dict[str, Any]  # what the report keeps per chunk beside the state's observation


class EnvelopePairing:
    def __init__(self):
        self.pending: Envelope | None = None
        self.problems: list[str] = []

    def envelope(self, data: bytes, arrived_ns: int, received: int) -> Envelope | None:
        """A binary message; None (and a problem) when it is not an envelope. `received`: chunks counted so far."""
        try:
            header, images = unpack(data)
            int(header["chunk"])
        except (ValueError, KeyError, TypeError) as exc:  # a malformed envelope (JSON errors are ValueErrors)
            self.problems.append(f"binary message #{received} is not a TFCH chunk envelope: {exc}")
            return None
        self._unpaired()
        self.pending = Envelope(header, images, arrived_ns)
        return self.pending

    def chunk_sent(self, event: dict[str, Any], resolution: str | None) -> PairedChunk | None:
        """The `chunk_sent` event of the pending envelope; None (and a problem) when no envelope came before it."""
        envelope, self.pending = self.pending, None
        if envelope is None:
            self.problems.append(f"chunk_sent for chunk {event.get('chunk')} arrived without its envelope")
            return None
        header, images, index = envelope.header, envelope.images, envelope.index
        for key in ("chunk", "frames", "first_frame"):
            if event.get(key) != header.get(key):
                self.problems.append(f"chunk {index}: envelope {key}={header.get(key)}, chunk_sent {event.get(key)}")
        crcs = header.get("crc32") or []
        if len(crcs) != header.get("frames") or event.get("checksum") != chunk_checksum(list(crcs)):
            self.problems.append(f"chunk {index}: the envelope's CRC32s do not give chunk_sent's checksum")
        if header.get("width") and header.get("height"):
            size = f"{header['width']}x{header['height']}"
            if resolution and resolution != size:
                self.problems.append(f"chunk {index}: {size} frames in a {resolution} session")
        data = {
            **event,
            "type": "chunk",
            "chunk": index,
            "frames": header.get("frames"),
            "first_frame": header.get("first_frame"),
            "image_bytes": [len(b) for b in images],
        }
        info = {
            "bytes": sum(len(b) for b in images),
            "queue_depth": event.get("queue_depth"),
            "encode_s": event.get("encode_seconds"),
        }
        chunk_event = SSEEvent(perf_ns=envelope.arrived_ns, event="chunk", data=json.dumps(data))
        return PairedChunk(int(index), chunk_event, info)

    def finish(self) -> None:
        self._unpaired()

    def _unpaired(self) -> None:
        if self.pending is not None:
            self.problems.append(f"chunk {self.pending.index}'s envelope had no chunk_sent event")
            self.pending = None
