"""Lossless-delivery checks for one stream session: pure functions over what the client observed. No aiperf imports.

A session is lossless when
  * the chunk indices are exactly 0..N-1, each once, in arrival order (no gap, no duplicate, no reordering),
  * N equals the chunk count the service declared (create answer `total_chunks`, `done.chunks`),
  * every chunk's `first_frame` continues the previous chunks (no frames missing inside the stream),
  * Σ chunk frames == the `published_frames` of the `done` event, and done reports no dropped frames,
  * Σ chunk frames == the frames the request asked for (`config.num_frames`),
  * with frames delivered in the events (`?frames=1`), each chunk carried as many images as it declares frames,
  * the stream ended with `done` (reason `completed`), not with an error, a close or a cut connection.

Every check returns human-readable problem strings; an empty list means the check passed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


class LosslessError(Exception):
    """A session that broke a lossless criterion; `problems` lists every broken one."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("lossless check failed: " + "; ".join(self.problems))


@dataclass
class ChunkObservation:
    """One chunk event as the client saw it."""

    index: int
    frames: int
    perf_ns: int  # arrival time (time.perf_counter_ns of the client)
    first_frame: int | None = None
    checksum: str | None = None
    compute_seconds: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    images: int | None = None  # images carried in the event (frames=1), None when not requested
    image_bytes: int = 0

    @classmethod
    def from_event(cls, data: dict[str, Any], perf_ns: int) -> ChunkObservation:
        """From the JSON data of an SSE `chunk` event; ValueError when a required field is missing or malformed."""
        for key in ("chunk", "frames"):
            value = data.get(key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"chunk event without an integer {key!r}: {_short(data)}")
        measurement = data.get("measurement") or {}
        compute = measurement.get("compute_seconds")
        images = data.get("images")
        image_bytes = data.get("image_bytes")
        if isinstance(images, list):
            count = len(images)
        else:
            count = len(image_bytes) if isinstance(image_bytes, list) else None
        return cls(
            index=data["chunk"],
            frames=data["frames"],
            perf_ns=perf_ns,
            first_frame=data.get("first_frame"),
            checksum=data.get("checksum"),
            compute_seconds=float(compute) if isinstance(compute, (int, float)) else None,
            phases={k: float(v) for k, v in (measurement.get("phases") or {}).items() if isinstance(v, (int, float))},
            images=count,
            image_bytes=sum(image_bytes) if isinstance(image_bytes, list) else 0,
        )


def _short(obj: Any, limit: int = 160) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ranges(values: Iterable[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7' (long lists of missing chunks stay readable)."""
    out: list[str] = []
    values = sorted(values)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out)


def check_chunk_indices(indices: Sequence[int], expected_chunks: int | None = None) -> list[str]:
    """Indices must be exactly 0..N-1 in arrival order, each once; N = expected_chunks when it is known."""
    problems: list[str] = []
    counts = Counter(indices)
    negative = sorted(i for i in counts if i < 0)
    if negative:
        problems.append(f"negative chunk index(es) {_ranges(negative)}")
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    if duplicated:
        problems.append("duplicated chunk(s) " + ", ".join(f"{i} (x{counts[i]})" for i in duplicated))
    top = max((i for i in counts if i >= 0), default=-1) + 1
    total = max(top, expected_chunks or 0)
    missing = sorted(set(range(total)) - set(counts))
    if missing:
        problems.append(f"missing chunk(s) {_ranges(missing)}: received {len(counts)} distinct of {total}")
    if expected_chunks is not None:
        beyond = sorted(i for i in counts if i >= expected_chunks)
        if beyond:
            problems.append(f"chunk(s) {_ranges(beyond)} beyond the declared {expected_chunks} chunks")
    for pos in range(1, len(indices)):
        if indices[pos] < indices[pos - 1]:
            problems.append(
                f"out-of-order chunk: chunk {indices[pos]} arrived after chunk {indices[pos - 1]} (event #{pos})"
            )
            break
    return problems


def check_frame_continuity(chunks: Sequence[ChunkObservation]) -> list[str]:
    """Each chunk's first_frame (when sent) must equal the frames of all chunks before it."""
    expected = 0
    for chunk in chunks:
        if chunk.first_frame is not None and chunk.first_frame != expected:
            message = (
                f"chunk {chunk.index} starts at frame {chunk.first_frame}, expected {expected} "
                f"(frames missing or repeated before it)"
            )
            return [message]
        expected += chunk.frames
    return []


def check_images(chunks: Sequence[ChunkObservation]) -> list[str]:
    bad = [c for c in chunks if c.images is not None and c.images != c.frames]
    return [f"chunk {c.index} declares {c.frames} frames but carried {c.images} image(s)" for c in bad[:5]]


def check_session(
    chunks: Sequence[ChunkObservation],
    done: dict[str, Any] | None,
    *,
    requested_frames: int | None = None,
    expected_chunks: int | None = None,
    declared_frames: int | None = None,
    end_reason: str | None = None,
    allow_stopped: bool = False,
) -> list[str]:
    """Every lossless criterion of the module docstring; `end_reason` says why the stream ended when done is absent.

    `expected_chunks`/`declared_frames` come from the create answer (`total_chunks`/`total_frames`); `done.chunks` is
    used when expected_chunks is unknown.
    """
    problems: list[str] = []
    if end_reason:
        problems.append(end_reason)
    if not chunks:
        problems.append("no chunk received")
    if expected_chunks is None and done is not None and isinstance(done.get("chunks"), int):
        expected_chunks = done["chunks"]
    problems += check_chunk_indices([c.index for c in chunks], expected_chunks)
    done_chunks = done.get("chunks") if done is not None else None
    if isinstance(done_chunks, int) and expected_chunks is not None and done_chunks != expected_chunks:
        problems.append(f"done reports {done_chunks} chunks; the session declared {expected_chunks}")
    problems += check_frame_continuity(chunks)
    problems += check_images(chunks)
    received = sum(c.frames for c in chunks)
    if done is None:
        if not end_reason:
            problems.append("the stream ended without a done event")
    else:
        published = done.get("published_frames")
        if not isinstance(published, int):
            problems.append(f"done event without an integer published_frames: {_short(done)}")
        elif received != published:
            problems.append(f"sum of chunk frames {received} != done.published_frames {published}")
        dropped = done.get("dropped_frames") or 0
        if dropped:
            problems.append(f"the service dropped {dropped} frame(s) (done.dropped_frames)")
        reason = done.get("reason", "completed")
        if reason != "completed" and not (allow_stopped and reason == "stopped"):
            problems.append(f"the stream ended with reason {reason!r}, not 'completed'")
    if requested_frames is not None and received != requested_frames:
        problems.append(f"received {received} frames; the request asked for {requested_frames}")
    if declared_frames is not None and requested_frames is not None and declared_frames != requested_frames:
        problems.append(f"the service planned {declared_frames} frames for a request of {requested_frames}")
    return problems


def check_ack(answer: dict[str, Any] | None, counted_frames: int) -> list[str]:
    """The service's answer to `POST .../ack {"published_frames": counted}` must say match."""
    if answer is None:
        return ["no delivery ack answer"]
    if answer.get("acked_frames") != counted_frames or answer.get("match") is not True:
        return [f"delivery ack mismatch: sent {counted_frames}, service answered {_short(answer)}"]
    return []


def verify(problems: Sequence[str]) -> None:
    if problems:
        raise LosslessError(problems)
