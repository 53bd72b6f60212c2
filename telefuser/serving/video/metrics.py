"""The video service's Prometheus metrics, names `telefuser_video_*` (the format is common/prometheus.py's)."""

from __future__ import annotations

from collections.abc import Iterable

from ..common.prometheus import CONTENT_TYPE, Metrics

__all__ = ["CONTENT_TYPE", "VideoMetrics"]

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
ALWAYS = (
    "jobs_submitted_total",
    "jobs_completed_total",
    "jobs_failed_total",
    "inference_seconds_total",
    "frames_generated_total",
)


class VideoMetrics(Metrics):
    def __init__(self, buckets: Iterable[float] = INFERENCE_BUCKETS):
        super().__init__(
            PREFIX,
            COUNTERS,
            zero=ALWAYS,
            histogram=("job_inference_seconds", "Generation seconds per completed job."),
            buckets=buckets,
        )
