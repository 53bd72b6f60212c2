"""The table a latency run prints: one row per measured run, from the same summary fields the page reports
(static/measure.js `summary()`), so the browser bench and the Python client print alike."""

from __future__ import annotations

import math
from typing import Any

COLUMNS = (
    "client",
    "transport",
    "model",
    "controls",
    "key->screen p50/p95 ms",
    "p95 in chunk intervals",
    "chunk interval ms",
    "transport p50/p95 ms",
    "displayed FPS",
    "stalls (s)",
    "generation FPS",
    "held max/buffer frames",
    "chunks over buffer",
    "media Mbit/s",
)


def percentile(values: list[float], q: float) -> float | None:
    """sorted[ceil(q n) - 1], as the page computes it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _num(value: Any, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def chunks_over_buffer(summary: dict[str, Any], chunk_frames: int = 16) -> float | None:
    held, buffer = summary.get("held_max_frames"), summary.get("buffer_frames")
    if held is None or not buffer:
        return None
    return max(0.0, (held - buffer) / chunk_frames)


def row(summary: dict[str, Any]) -> tuple[str, ...]:
    p95, interval = summary.get("latency_p95_ms"), summary.get("chunk_interval_mean_ms")
    rate = summary.get("bytes_per_s")
    return (
        str(summary.get("client", "browser")),
        str(summary.get("transport")),
        str(summary.get("model", "")),
        str(summary.get("controls")),
        f"{_num(summary.get('latency_p50_ms'))} / {_num(p95)}",
        _num(p95 / interval, 2) if p95 is not None and interval else "n/a",
        _num(interval),
        f"{_num(summary.get('overhead_p50_ms'))} / {_num(summary.get('overhead_p95_ms'))}",
        _num(summary.get("displayed_fps"), 1),
        f"{summary.get('stalls')} ({_num((summary.get('stalled_ms') or 0) / 1000, 1)})",
        _num(summary.get("generation_fps"), 1),
        f"{summary.get('held_max_frames')}/{summary.get('buffer_frames')}",
        _num(chunks_over_buffer(summary), 2),
        _num(rate * 8 / 1e6 if rate is not None else None, 2),
    )


def print_table(title: str, summaries: list[dict[str, Any]], notes: list[str] = ()) -> None:
    rows = [COLUMNS, *(row(s) for s in summaries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["", f"== {title}"]
    lines += [
        "  ".join(cell.rjust(w) if i > 2 else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))) for r in rows
    ]
    lines += [f"   {note}" for note in notes]
    print("\n".join(lines), flush=True)
