"""The stream service's Prometheus metrics, names `telefuser_stream_*` (the format is common/prometheus.py's).

A `StreamMetrics` object lives in the app; gauges are read from the live sessions at scrape time. An AIPerf run can
scrape these to check `frames_sent == frames_generated` and `frames_dropped == 0` over its window.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..common.prometheus import CONTENT_TYPE, Metrics

__all__ = ["CONTENT_TYPE", "StreamMetrics"]

PREFIX = "telefuser_stream_"
COMPUTE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
COUNTERS = (
    ("sessions_created_total", "Sessions created."),
    ("sessions_closed_total", "Sessions whose model slot was released, by reason."),
    ("sessions_rejected_total", "Session requests refused, by reason."),
    ("chunks_generated_total", "Chunks computed by the model."),
    ("chunks_sent_total", "Chunks delivered to a client."),
    ("chunks_dropped_total", "Chunks dropped before delivery (none since bounded playout; kept for dashboards)."),
    ("frames_generated_total", "Frames computed by the model."),
    ("frames_sent_total", "Frames delivered to a client."),
    ("frames_dropped_total", "Frames dropped before delivery (none since bounded playout; kept for dashboards)."),
    ("bytes_sent_total", "Encoded frame bytes delivered."),
    ("encode_seconds_total", "Time spent encoding frames for delivery."),
    ("backpressure_seconds_total", "Time the generator waited for a full delivery queue."),
    ("playout_wait_seconds_total", "Time the generator waited for the viewer to play (bounded playout)."),
    ("playout_reports_total", "Playout reports from clients (frames displayed, frames held)."),
    ("playout_over_buffer_total", "Playout reports of a client holding more than the announced buffer."),
    ("controls_total", "Control messages accepted."),
    ("control_errors_total", "Control messages rejected."),
    ("client_messages_dropped_total", "WebSocket messages dropped unread: over the rate limit."),
    ("notices_dropped_total", "Status events dropped: the consumer had max_notices unread."),
    ("delivery_acks_total", "Delivery acks at the end of a stream: match, mismatch or missing."),
)
BY_LABEL = ("sessions_closed_total", "sessions_rejected_total", "delivery_acks_total")  # series appear when counted


class StreamMetrics(Metrics):
    def __init__(self, buckets: Iterable[float] = COMPUTE_BUCKETS):
        super().__init__(
            PREFIX,
            COUNTERS,
            zero=[name for name, _ in COUNTERS if name not in BY_LABEL],
            histogram=(
                "chunk_compute_seconds",
                "Model compute time per chunk (the chunk measurement's compute_seconds).",
            ),
            buckets=buckets,
        )
