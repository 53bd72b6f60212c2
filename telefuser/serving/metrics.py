"""Service metrics in the Prometheus text exposition format (version 0.0.4), without prometheus_client.

A `StreamMetrics` object lives in the app; counters are updated from the event loop and worker threads (hence the
lock) and gauges are read from the live sessions at scrape time. An AIPerf run can scrape these to check
`frames_sent == frames_generated` and `frames_dropped == 0` over its window.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
COMPUTE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
PREFIX = "telefuser_stream_"


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    esc = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc)) + "}"


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def histogram_lines(name: str, text: str, buckets: tuple[float, ...], counts: list[int], total: float) -> list[str]:
    """A Prometheus histogram: cumulative buckets (the last one +Inf), sum and count."""
    lines = [f"# HELP {name} {text}", f"# TYPE {name} histogram"]
    running = 0
    for bound, count in zip((*buckets, math.inf), counts):
        running += count
        lines.append(f'{name}_bucket{{le="{_num(bound)}"}} {running}')
    return lines + [f"{name}_sum {_num(total)}", f"{name}_count {running}"]


def gauge_lines(prefix: str, gauges: Iterable[tuple[str, str, float, dict[str, str]]]) -> list[str]:
    """Gauges read at scrape time, (name, help, value, labels); HELP/TYPE once per name."""
    lines: list[str] = []
    seen: set[str] = set()
    for gname, text, value, labels in gauges:
        if gname not in seen:
            seen.add(gname)
            lines += [f"# HELP {prefix}{gname} {text}", f"# TYPE {prefix}{gname} gauge"]
        lines.append(f"{prefix}{gname}{_labels(tuple(sorted(labels.items())))} {_num(value)}")
    return lines


class StreamMetrics:
    def __init__(self, buckets: Iterable[float] = COMPUTE_BUCKETS):
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple, float]] = {}
        self._help: dict[str, str] = {}
        self._buckets = tuple(sorted(buckets))
        self._hist_counts = [0] * (len(self._buckets) + 1)
        self._hist_sum = 0.0
        for name, text in (
            ("sessions_created_total", "Sessions created."),
            ("sessions_closed_total", "Sessions whose model slot was released, by reason."),
            ("sessions_rejected_total", "Session requests refused, by reason."),
            ("chunks_generated_total", "Chunks computed by the model."),
            ("chunks_sent_total", "Chunks delivered to a client."),
            ("chunks_dropped_total", "Chunks dropped before delivery (realtime mode only)."),
            ("frames_generated_total", "Frames computed by the model."),
            ("frames_sent_total", "Frames delivered to a client."),
            ("frames_dropped_total", "Frames dropped before delivery (always 0 in lossless mode)."),
            ("bytes_sent_total", "Encoded frame bytes delivered."),
            ("encode_seconds_total", "Time spent encoding frames for delivery."),
            ("backpressure_seconds_total", "Time the generator waited for a full delivery queue (lossless mode)."),
            ("controls_total", "Control messages accepted."),
            ("control_errors_total", "Control messages rejected."),
            ("client_messages_dropped_total", "WebSocket messages dropped unread: over the rate limit."),
            ("notices_dropped_total", "Status events dropped: the consumer had max_notices unread."),
            ("delivery_acks_total", "Delivery acks at the end of a stream: match, mismatch or missing."),
        ):
            self._counters[name] = {}
            self._help[name] = text
        for zero in ("sessions_created_total", "chunks_generated_total", "chunks_sent_total", "chunks_dropped_total",
                     "frames_generated_total", "frames_sent_total", "frames_dropped_total", "bytes_sent_total",
                     "encode_seconds_total", "backpressure_seconds_total", "controls_total", "control_errors_total",
                     "client_messages_dropped_total", "notices_dropped_total"):
            self._counters[zero][()] = 0.0  # always exported, so a scraper can diff from the first scrape

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + value

    def observe_compute(self, seconds: float) -> None:
        with self._lock:
            i = next((i for i, b in enumerate(self._buckets) if seconds <= b), len(self._buckets))
            self._hist_counts[i] += 1
            self._hist_sum += seconds

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def render(self, gauges: Iterable[tuple[str, str, float, dict[str, str]]] = ()) -> str:
        """gauges: (name, help, value, labels) read by the caller at scrape time."""
        lines: list[str] = []
        with self._lock:
            for name, series in self._counters.items():
                lines += [f"# HELP {PREFIX}{name} {self._help[name]}", f"# TYPE {PREFIX}{name} counter"]
                lines += [f"{PREFIX}{name}{_labels(k)} {_num(v)}" for k, v in sorted(series.items())]
            lines += histogram_lines(f"{PREFIX}chunk_compute_seconds",
                                     "Model compute time per chunk (the chunk measurement's compute_seconds).",
                                     self._buckets, self._hist_counts, self._hist_sum)
        return "\n".join(lines + gauge_lines(PREFIX, gauges)) + "\n"
