"""The memory plan against what ran: one row per `run_t2va.py` / `run_i2v.py` metrics JSON.

    python -m tools.bench.memory_report docs/perf/2026-12-06/call1_c72410e/*/*.json

Each row: the run, the tier and what it kept resident, the plan's estimated peak, the measured peaks (allocated and
reserved, the largest of loading and every stage), the estimate over the measured reserved peak, and the speed
(seconds per request and per warm DiT call for MiniMax H3, steady FPS for LingBot).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

GIB = 1 << 30


def _largest(*groups) -> int:
    values = []
    for group in groups:
        if isinstance(group, dict):
            values += [v for v in group.values() if isinstance(v, int)]
            values += [_largest(v) for v in group.values() if isinstance(v, dict)]
    return max(values, default=0)


def row(path: Path) -> dict:
    data = json.loads(path.read_text())
    plan = data.get("memory_plan") or {}
    load = data.get("load_peak_bytes") or {}
    if "summary" in data:  # a LingBot session
        phases = data["summary"].get("phase_peak_bytes") or {}
        opened = data.get("open_peak_bytes") or {}
        allocated = _largest({"a": load.get("allocated", 0)}, phases.get("allocated", {}), opened.get("allocated", {}))
        reserved = _largest({"r": load.get("reserved", 0)}, phases.get("reserved", {}), opened.get("reserved", {}))
        speed = f"{data['summary']['steady_compute_fps']:.2f} FPS steady"
    else:  # a MiniMax H3 request
        stages = data["peak_memory"].get("stages") or {}
        allocated = _largest({"a": load.get("allocated", 0)}, stages.get("allocated", {}))
        reserved = _largest({"r": load.get("reserved", 0)}, stages.get("reserved", {}))
        timings = data["timings"]
        steps = timings["dit_step_s"]
        warm = statistics.median(steps[1:]) if len(steps) > 1 else steps[0]
        speed = f"{timings['pipeline_s']:.1f} s ({warm:.2f} s/warm call; first {steps[0]:.1f})"
    estimate = plan.get("estimated_peak_bytes", 0)
    return {
        "run": path.parent.name,
        "tier": plan.get("tier", "-"),
        "resident": ", ".join(f"{k} {v}" for k, v in (plan.get("resident_layers") or {}).items()) or "all",
        "estimate": estimate / GIB,
        "allocated": allocated / GIB,
        "reserved": reserved / GIB,
        "ratio": estimate / reserved if reserved else float("nan"),
        "speed": speed,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="metrics JSON files of run_t2va.py / run_i2v.py")
    args = p.parse_args(argv)
    print(
        "| run | tier | resident layers | estimate GiB | allocated GiB | reserved GiB | estimate / reserved | speed |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for path in args.files:
        r = row(path)
        print(
            f"| {r['run']} | {r['tier']} | {r['resident']} | {r['estimate']:.1f} | {r['allocated']:.1f} | "
            f"{r['reserved']:.1f} | {r['ratio']:.2f} | {r['speed']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
