"""The page's measurements (telefuser/serving/stream/static/measure.js) in Python, for the Python client: the same
events, the same definitions, the same summary fields, so its rows and the browser's compare."""

from __future__ import annotations

from typing import Any

from tools.bench.stream_latency.table import percentile


def overhead_ms(computed_at_ms: float, displayable_at_ms: float, paced_ms: float = 0.0) -> float:
    """Transport overhead of one chunk (PROTOCOL.md, "Measuring the transport overhead"): from the server's
    `computed_at` to when the client could first draw the chunk's first frame (both wall clock, epoch ms), less the
    time the server's WebRTC track held that frame for its due time (`paced_ms`; 0 on the WebSocket)."""
    return displayable_at_ms - computed_at_ms - paced_ms


class Measure:
    def __init__(self):
        self.pending: dict[int, tuple[float, list[str]]] = {}  # seq -> (sent at, keys)
        self.latencies: list[dict[str, Any]] = []  # {seq, keys, ms, chunk}
        self.arrivals: list[float] = []
        self.draws = 0
        self.first_draw = self.last_draw = None
        self.held_max = 0
        self.bytes = 0
        self.first_byte_at = self.last_byte_at = None
        self.compute_fps: list[float] = []
        self.stalls = 0
        self.stalled_s = 0.0
        self._stalled_at: float | None = None
        self.overheads: list[dict[str, Any]] = []  # {chunk, ms, paced_ms}
        self._overhead_chunks: set[int] = set()

    def transported(self, chunk: int, computed_at_ms: float | None, displayable_at_ms: float, paced_ms=0.0) -> None:
        """The first frame of `chunk` could be drawn at `displayable_at_ms` (epoch ms); once per chunk, and only when
        the server stamped it."""
        if computed_at_ms is None or chunk in self._overhead_chunks:
            return
        self._overhead_chunks.add(chunk)
        ms = overhead_ms(computed_at_ms, displayable_at_ms, paced_ms)
        self.overheads.append({"chunk": chunk, "ms": round(ms, 3), "paced_ms": paced_ms})

    def pressed(self, seq: int, keys: list[str], t: float) -> None:
        self.pending[seq] = (t, keys)

    def chunk_arrived(self, t: float, nbytes: int) -> None:
        self.arrivals.append(t)
        if self.first_byte_at is None:
            self.first_byte_at = t
        self.last_byte_at = t
        self.bytes += nbytes

    def computed(self, frames: int, seconds: float) -> None:
        if seconds > 0:
            self.compute_fps.append(frames / seconds)

    def held(self, frames: int) -> None:
        self.held_max = max(self.held_max, frames)

    def stalled(self, dry: bool, t: float) -> None:
        if dry:
            self.stalls += 1
            self._stalled_at = t
        elif self._stalled_at is not None:
            self.stalled_s += t - self._stalled_at
            self._stalled_at = None

    def drawn(self, seq: int | None, chunk: int, t: float) -> None:
        """A frame computed under control `seq` is on screen at `t` (seconds)."""
        self.draws += 1
        if self.first_draw is None:
            self.first_draw = t
        self.last_draw = t
        if seq is None:
            return
        for s in [s for s in self.pending if s <= seq]:
            sent, keys = self.pending.pop(s)
            self.latencies.append({"seq": s, "keys": keys, "ms": round((t - sent) * 1000), "chunk": chunk})

    def summary(self) -> dict[str, Any]:
        ms = [r["ms"] for r in self.latencies]
        gaps = [(b - a) * 1000 for a, b in zip(self.arrivals, self.arrivals[1:])]
        play_s = (self.last_draw - self.first_draw) if self.draws > 1 else None
        byte_s = (self.last_byte_at - self.first_byte_at) if self.last_byte_at is not None else 0
        steady = self.compute_fps[1:] or self.compute_fps
        return {
            "controls": len(self.latencies),
            "pending_controls": len(self.pending),
            "latency_records": list(self.latencies),
            "latency_p50_ms": percentile(ms, 0.5),
            "latency_p95_ms": percentile(ms, 0.95),
            "chunks": len(self.arrivals),
            "chunk_interval_p50_ms": percentile(gaps, 0.5),
            "chunk_interval_mean_ms": sum(gaps) / len(gaps) if gaps else None,
            "frames_drawn": self.draws,
            "displayed_fps": (self.draws - 1) / play_s if play_s else None,
            "held_max_frames": self.held_max,
            "stalls": self.stalls,
            "stalled_ms": round(self.stalled_s * 1000),
            "bytes": self.bytes,
            "bytes_per_s": self.bytes / byte_s if byte_s > 0 else None,
            "generation_fps": percentile(steady, 0.5),
            "overhead_chunks": len(self.overheads),
            "overhead_p50_ms": percentile([o["ms"] for o in self.overheads], 0.5),
            "overhead_p95_ms": percentile([o["ms"] for o in self.overheads], 0.95),
            "overhead_records": list(self.overheads),
            "pacing_wait_p50_ms": percentile([o["paced_ms"] for o in self.overheads], 0.5),
            "pacing_wait_p95_ms": percentile([o["paced_ms"] for o in self.overheads], 0.95),
            "clock_offset_ms": 0.0,  # one clock (time.time) on both ends of the overhead
        }
