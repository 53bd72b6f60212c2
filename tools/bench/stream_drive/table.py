"""What a run prints on stdout: the service and plan, one row per session, its phases and controls, the metrics, the
verdict. Everything comes from the JSON summary, so the table and the file never disagree."""

from __future__ import annotations

from typing import Any

from tools.aiperf.telefuser_aiperf.runner import format_value

COLUMNS = (
    "session",
    "frames",
    "chunks",
    "first frame s",
    "interval mean/p50/p95/max s",
    "session FPS",
    "steady FPS",
    "compute FPS",
    "lossless",
)


def print_table(summary: dict[str, Any]) -> None:
    lines = ["", "== TeleFuser stream drive (WebSocket client, no AIPerf)"]
    lines += _setup_lines(summary)
    lines += _aligned([COLUMNS, *(_row(r) for r in summary.get("sessions") or [])])
    for report in summary.get("sessions") or []:
        lines += _detail_lines(report)
    lines += _run_lines(summary)
    print("\n".join(lines), flush=True)


def _setup_lines(summary: dict[str, Any]) -> list[str]:
    meta = ((summary.get("service") or {}).get("metadata") or {}).get("model") or {}
    plan, lines = summary.get("plan") or {}, []
    if meta:
        warmup = f"warm-up {meta['warmup_s']} s" if meta.get("warmup_s") is not None else "no warm-up"
        lines.append(
            f"   model {meta.get('model')} ({meta.get('weights')}) on {meta.get('device')}, {warmup}, "
            f"transport {meta.get('ulysses_transport')}"
        )
    if plan:
        config = plan.get("config") or {}
        lines.append(
            f"   plan {config.get('num_frames')} frames at {config.get('resolution') or 'the default resolution'}, "
            f"{config.get('fps')} fps, seed {config.get('seed')}, {config.get('frame_policy')}; codec "
            f"{plan.get('codec')}; {len(plan.get('controls') or [])} control step(s) on the "
            f"{plan.get('control_timing')} clock; {plan.get('sessions')} session(s), {plan.get('concurrency')} at a time"
        )
    return lines


def _row(r: dict[str, Any]) -> tuple[str, ...]:
    iv = r.get("chunk_interval_s") or {}
    return (
        str(r["session"]),
        f"{r['frames']}/{r['requested_frames']}",
        f"{r['chunks']}/{r['expected_chunks']}",
        format_value(r.get("first_frame_s")),
        "/".join(format_value(iv.get(k)) for k in ("mean", "p50", "p95", "max")),
        format_value(r.get("session_fps"), 2),
        format_value(r.get("steady_fps"), 2),
        format_value(r.get("steady_compute_fps"), 2),
        "PASS" if r["passed"] else "FAIL",
    )


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["   " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]


def _detail_lines(r: dict[str, Any]) -> list[str]:
    lines = []
    phases, compute = r.get("steady_phase_mean_s") or {}, r.get("chunk_compute_s") or {}
    if phases or compute:
        lines.append(
            f"   session {r['session']} steady chunk compute mean {format_value(compute.get('mean'))} s; phase means: "
            + (", ".join(f"{k} {v:.4f}" for k, v in phases.items()) or "none")
        )
    controls = r.get("controls") or []
    if controls or r.get("controls_skipped"):
        latency = r.get("control_latency_ms") or {}
        lines.append(
            f"   session {r['session']} controls: {len(controls)} sent, "
            f"{sum(c['confirmed'] for c in controls)} confirmed (control_state after p50 "
            f"{format_value(latency.get('p50'), 1)} ms, max {format_value(latency.get('max'), 1)} ms), "
            f"{len(r.get('controls_skipped') or [])} not sent"
        )
    return lines


def _run_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    sm = summary.get("service_metrics") or {}
    if sm:
        d = sm.get("deltas") or {}
        lines.append(
            f"   metrics: chunk_compute mean {format_value(sm.get('chunk_compute_mean_s'))} s, encode "
            f"{format_value(sm.get('encode_per_chunk_s'), 4)} s/chunk, backpressure "
            f"{format_value(sm.get('backpressure_s'))} s, frames generated/sent/dropped "
            f"{d.get('frames_generated_total', 0):g}/{d.get('frames_sent_total', 0):g}/{d.get('frames_dropped_total', 0):g}"
        )
    agg = summary.get("aggregate") or {}
    if agg and agg.get("sessions", 0) > 1:
        lines.append(
            f"   all sessions: {agg['frames']} frames in {agg['wall_s']} s, delivered "
            f"{format_value(agg['delivered_fps'], 2)} FPS"
        )
    lines += [f"   warning: {w}" for w in summary.get("warnings") or []]
    lines.append(f"   lossless verdict     {'PASSED' if summary.get('passed') else 'FAILED'}")
    lines += [f"     - {problem}" for problem in summary.get("problems") or []]
    lines.append(f"   summary              {summary.get('output')}")
    return lines
