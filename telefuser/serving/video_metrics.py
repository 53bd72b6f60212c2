"""Prometheus text (0.0.4) for the video service, names `telefuser_video_*`; the format helpers are metrics.py's.

Counters are bumped from the event loop and the worker thread (hence the lock); gauges are read by the caller at
scrape time and passed to `render`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .metrics import CONTENT_TYPE, _labels, _num, gauge_lines, histogram_lines

PREFIX = "telefuser_video_"
INFERENCE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
COUNTERS = (
    ("jobs_submitted_total", "Jobs accepted into the queue."),
    ("jobs_rejected_total", "Submissions refused, by reason (invalid, queue_full, shutting_down)."),
    ("jobs_completed_total", "Jobs that produced a video."),
    ("jobs_failed_total", "Jobs that failed while generating."),
    ("jobs_cancelled_total", "Jobs cancelled, by reason (client, shutdown) and state (queued, in_progress)."),
    ("jobs_deleted_total", "Finished jobs deleted with their files."),
    ("inference_seconds_total", "Generation seconds of completed jobs (their inference_time_s)."),
    ("frames_generated_total", "Video frames of completed jobs."),
)
ALWAYS = ("jobs_submitted_total", "jobs_completed_total", "jobs_failed_total", "inference_seconds_total",
          "frames_generated_total")  # fmt: skip

__all__ = ["CONTENT_TYPE", "VideoMetrics"]


class VideoMetrics:
    def __init__(self, buckets: Iterable[float] = INFERENCE_BUCKETS):
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple, float]] = {name: {} for name, _ in COUNTERS}
        for name in ALWAYS:
            self._counters[name][()] = 0.0  # exported from the first scrape, so a scraper can diff
        self._buckets = tuple(sorted(buckets))
        self._hist = [0] * (len(self._buckets) + 1)
        self._hist_sum = 0.0

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + value

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def observe_inference(self, seconds: float) -> None:
        with self._lock:
            self._hist[next((i for i, b in enumerate(self._buckets) if seconds <= b), len(self._buckets))] += 1
            self._hist_sum += seconds

    def mean_inference_s(self) -> float | None:
        with self._lock:
            count = sum(self._hist)
            return self._hist_sum / count if count else None

    def render(self, gauges: Iterable[tuple[str, str, float, dict[str, str]]] = ()) -> str:
        lines: list[str] = []
        with self._lock:
            for name, text in COUNTERS:
                lines += [f"# HELP {PREFIX}{name} {text}", f"# TYPE {PREFIX}{name} counter"]
                lines += [f"{PREFIX}{name}{_labels(k)} {_num(v)}" for k, v in sorted(self._counters[name].items())]
            lines += histogram_lines(f"{PREFIX}job_inference_seconds", "Generation seconds per completed job.",
                                     self._buckets, self._hist, self._hist_sum)
        return "\n".join(lines + gauge_lines(PREFIX, gauges)) + "\n"
