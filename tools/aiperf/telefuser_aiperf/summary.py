"""Summary statistics of stream sessions. No aiperf imports.

Percentiles are deliberately simple and stated here so that numbers can be recomputed by hand:
    p50 = statistics.median(values)
    p90 = sorted(values)[int(0.9 * (n - 1))]   (nearest-rank from below, no interpolation)
    max = max(values)

Steady compute FPS = Σ frames / Σ compute_seconds over the chunks with index >= warmup_chunks (default 1: chunk 0,
which also carries one-time work such as encoding the start image, is left out). compute_seconds is the model's own
per-chunk measurement (telefuser's `Chunk.measurement`): condition handling, DiT, clean-KV update, VAE decode,
GPU->CPU copy and frame conversion; not model loading, pacing, encoding, network or the client.

Client FPS = frames of chunks 1..N-1 / (arrival of the last chunk - arrival of the first chunk): the delivery rate a
viewer that starts playing at the first chunk sees. First-frame latency = arrival of chunk 0 - request start (the
request starts before `POST /v1/stream/sessions`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from .lossless import ChunkObservation


def p50(values: Sequence[float]) -> float:
    return statistics.median(values)


def p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.9 * (len(ordered) - 1))]


def distribution(values: Sequence[float], digits: int = 6) -> dict[str, Any] | None:
    if not values:
        return None
    return {
        "count": len(values),
        "p50": round(p50(values), digits),
        "p90": round(p90(values), digits),
        "max": round(max(values), digits),
        "mean": round(statistics.fmean(values), digits),
    }


def steady_chunks(chunks: Sequence[ChunkObservation], warmup_chunks: int = 1) -> list[ChunkObservation]:
    return [c for c in chunks if c.index >= warmup_chunks]


def steady_compute_fps(chunks: Sequence[ChunkObservation], warmup_chunks: int = 1) -> float | None:
    steady = [c for c in steady_chunks(chunks, warmup_chunks) if c.compute_seconds is not None]
    seconds = sum(c.compute_seconds for c in steady)
    if not steady or seconds <= 0:
        return None
    return sum(c.frames for c in steady) / seconds


def client_fps(chunks: Sequence[ChunkObservation]) -> float | None:
    if len(chunks) < 2:
        return None
    ordered = sorted(chunks, key=lambda c: c.perf_ns)
    span_s = (ordered[-1].perf_ns - ordered[0].perf_ns) / 1e9
    if span_s <= 0:
        return None
    return sum(c.frames for c in ordered[1:]) / span_s


def chunk_intervals_s(chunks: Sequence[ChunkObservation]) -> list[float]:
    ordered = sorted(c.perf_ns for c in chunks)
    return [(b - a) / 1e9 for a, b in pairwise(ordered)]


def phase_totals(chunks: Sequence[ChunkObservation]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for chunk in chunks:
        for name, seconds in chunk.phases.items():
            totals[name] = totals.get(name, 0.0) + seconds
    return {k: round(v, 6) for k, v in sorted(totals.items())}


def summarize_session(
    chunks: Sequence[ChunkObservation],
    *,
    start_ns: int | None,
    warmup_chunks: int = 1,
    target_fps: float | None = None,
) -> dict[str, Any]:
    steady = steady_chunks(chunks, warmup_chunks)
    compute_fps = steady_compute_fps(chunks, warmup_chunks)
    first = min((c.perf_ns for c in chunks), default=None)
    out: dict[str, Any] = {
        "chunks": len(chunks),
        "frames": sum(c.frames for c in chunks),
        "warmup_chunks": warmup_chunks,
        "steady_chunks": len(steady),
        "steady_frames": sum(c.frames for c in steady),
        "steady_compute_seconds": round(sum(c.compute_seconds or 0.0 for c in steady), 6),
        "steady_compute_fps": None if compute_fps is None else round(compute_fps, 4),
        "client_fps": None if client_fps(chunks) is None else round(client_fps(chunks), 4),
        "first_frame_latency_s": None if first is None or start_ns is None else round((first - start_ns) / 1e9, 6),
        "chunk_compute_s": distribution([c.compute_seconds for c in steady if c.compute_seconds is not None]),
        "warmup_chunk_compute_s": [c.compute_seconds for c in chunks if c.index < warmup_chunks],
        "chunk_interval_s": distribution(chunk_intervals_s(chunks)),
        "steady_phase_seconds": phase_totals(steady),
    }
    if target_fps:
        out["target_fps"] = target_fps
        out["realtime_factor"] = None if compute_fps is None else round(compute_fps / target_fps, 4)
    return out
