"""Service metrics in the Prometheus text exposition format (version 0.0.4), without prometheus_client.

`Metrics` holds one service's counters (by name and labels) and one histogram of seconds. Counters are bumped from
the event loop and worker threads (hence the lock); gauges are read by the caller at scrape time and passed to
`render`, so they are never stale.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Gauge = tuple[str, str, float, dict[str, str]]  # (name, help, value, labels)


def labels_text(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    esc = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc)) + "}"


def number_text(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def histogram_lines(name: str, text: str, buckets: tuple[float, ...], counts: list[int], total: float) -> list[str]:
    """A Prometheus histogram: cumulative buckets (the last one +Inf), sum and count."""
    lines = [f"# HELP {name} {text}", f"# TYPE {name} histogram"]
    running = 0
    for bound, count in zip((*buckets, math.inf), counts):
        running += count
        lines.append(f'{name}_bucket{{le="{number_text(bound)}"}} {running}')
    return lines + [f"{name}_sum {number_text(total)}", f"{name}_count {running}"]


def gauge_lines(prefix: str, gauges: Iterable[Gauge]) -> list[str]:
    """Gauges read at scrape time, (name, help, value, labels); HELP/TYPE once per name."""
    lines: list[str] = []
    seen: set[str] = set()
    for gname, text, value, labels in gauges:
        if gname not in seen:
            seen.add(gname)
            lines += [f"# HELP {prefix}{gname} {text}", f"# TYPE {prefix}{gname} gauge"]
        lines.append(f"{prefix}{gname}{labels_text(tuple(sorted(labels.items())))} {number_text(value)}")
    return lines


class Metrics:
    """Counters named `prefix + name` and one histogram; `zero` names the counters exported from the first scrape
    (so a scraper can diff from it)."""

    def __init__(
        self,
        prefix: str,
        counters: Iterable[tuple[str, str]],
        *,
        zero: Iterable[str],
        histogram: tuple[str, str],
        buckets: Iterable[float],
    ):
        self._prefix = prefix
        self._lock = threading.Lock()
        self._help = dict(counters)
        self._counters: dict[str, dict[tuple, float]] = {name: {} for name in self._help}
        for name in zero:
            self._counters[name][()] = 0.0
        self._histogram = histogram
        self._buckets = tuple(sorted(buckets))
        self._hist_counts = [0] * (len(self._buckets) + 1)
        self._hist_sum = 0.0

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + value

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def observe(self, seconds: float) -> None:
        """One sample of the histogram."""
        with self._lock:
            self._hist_counts[next((i for i, b in enumerate(self._buckets) if seconds <= b), len(self._buckets))] += 1
            self._hist_sum += seconds

    def mean_observed(self) -> float | None:
        with self._lock:
            count = sum(self._hist_counts)
            return self._hist_sum / count if count else None

    def render(self, gauges: Iterable[Gauge] = ()) -> str:
        """Counters, the histogram, then the caller's gauges."""
        lines: list[str] = []
        prefix = self._prefix
        with self._lock:
            for name, series in self._counters.items():
                lines += [f"# HELP {prefix}{name} {self._help[name]}", f"# TYPE {prefix}{name} counter"]
                lines += [f"{prefix}{name}{labels_text(k)} {number_text(v)}" for k, v in sorted(series.items())]
            name, text = self._histogram
            lines += histogram_lines(prefix + name, text, self._buckets, self._hist_counts, self._hist_sum)
        return "\n".join(lines + gauge_lines(prefix, gauges)) + "\n"
