"""The verdict and the numbers of each session, and of all sessions of a run (the JSON summary's sessions and
aggregate). Times are on this client's clock, relative to the start of the session's create."""

from __future__ import annotations

import math
from typing import Any

from tools.aiperf.telefuser_aiperf.lossless import check_ack, check_session
from tools.aiperf.telefuser_aiperf.summary import distribution, summarize_session
from tools.bench.stream_drive.driver import SessionDriver


def seconds_since(t: int | None, start: int) -> float | None:
    return None if t is None else round((t - start) / 1e9, 6)


def distribution_p95(values: list[float]) -> dict[str, Any] | None:
    """summary.distribution (count, p50, p90, max, mean) plus p95 by nearest rank: sorted[ceil(0.95 n) - 1]."""
    out = distribution(values)
    if out is not None:
        out["p95"] = round(sorted(values)[math.ceil(0.95 * len(values)) - 1], 6)
    return out


def session_problems(driver: SessionDriver) -> list[str]:
    """The lossless criteria, the protocol checks, the ack and the session's final status."""
    state, answer = driver.state, driver.state.create_answer or {}
    declared = answer.get("total_frames")
    problems = check_session(
        state.chunks,
        state.done,
        requested_frames=state.options.requested_frames,
        expected_chunks=state.expected_chunks,
        declared_frames=declared if isinstance(declared, int) else None,
        end_reason=state.end_reason,
    )
    problems += state.service_errors + driver.pairing.problems + driver.protocol
    if state.done is None:
        return problems
    if state.ack_problems:
        problems += state.ack_problems
    elif state.ack_answer is None:
        problems += check_ack(None, state.counted_frames)
    final, counted = driver.final_status or {}, state.counted_frames
    if (final.get("acked_frames"), final.get("published_frames"), final.get("ack_match")) != (counted, counted, True):
        problems.append(
            f"the session's final status says published {final.get('published_frames')}, acked "
            f"{final.get('acked_frames')}, ack_match {final.get('ack_match')}; the client received {counted}"
        )
    return problems


def control_rows(driver: SessionDriver) -> list[dict[str, Any]]:
    rows = []
    for result in driver.state.controls:
        row = result.as_dict(driver.state.start_ns)
        row.pop("status", None)  # over the WebSocket a control has no HTTP status; control_state confirms it
        row["confirmed"] = result.answered_ns is not None
        row["latency_ms"] = (
            None if result.answered_ns is None else round((result.answered_ns - result.sent_ns) / 1e6, 3)
        )
        rows.append(row)
    return rows


def session_report(driver: SessionDriver) -> dict[str, Any]:
    state, options = driver.state, driver.state.options
    start = state.start_ns
    summary = summarize_session(
        state.chunks,
        start_ns=start,
        warmup_chunks=int(options.harness["warmup_chunks"]),
        target_fps=options.harness.get("target_fps") or options.config.get("fps"),
    )
    intervals = [(b.perf_ns - a.perf_ns) / 1e9 for a, b in zip(state.chunks, state.chunks[1:], strict=False)]
    steady = max(1, summary["steady_chunks"])
    last = max((c.perf_ns for c in state.chunks), default=None)
    frames = summary["frames"]
    problems = session_problems(driver)
    controls = control_rows(driver)
    unconfirmed = [c for c in controls if not c["confirmed"]]
    if unconfirmed:
        driver.warnings.append(f"{len(unconfirmed)} control(s) sent without a control_state before the stream ended")
    skipped = [s.describe() for s in state.skipped_controls()]
    if skipped:
        driver.warnings.append(f"{len(skipped)} control step(s) not sent: the stream ended first")
    answer = state.create_answer or {}
    return {
        "session": driver.number,
        "session_id": state.session_id,
        "prompt": driver.prompt.text,
        "image": driver.prompt.image_path,
        "passed": not problems,
        "problems": problems,
        "warnings": driver.warnings,
        "requested_frames": options.requested_frames,
        "expected_chunks": state.expected_chunks,
        "frames": frames,
        "chunks": summary["chunks"],
        "resolution": answer.get("resolution"),
        "codec": answer.get("codec"),
        "create_s": seconds_since(driver.created_ns, start),
        "ws_connected_s": seconds_since(driver.connected_ns, start),
        "first_frame_s": summary["first_frame_latency_s"],
        "last_chunk_s": seconds_since(last, start),
        "chunk_interval_s": distribution_p95(intervals),
        "session_fps": None if last is None or last <= start else round(frames / ((last - start) / 1e9), 4),
        "steady_fps": summary["client_fps"],
        "steady_compute_fps": summary["steady_compute_fps"],
        "target_fps": summary.get("target_fps"),
        "warmup_chunks": summary["warmup_chunks"],
        "chunk_compute_s": summary["chunk_compute_s"],
        "warmup_chunk_compute_s": summary["warmup_chunk_compute_s"],
        "steady_phase_mean_s": {k: round(v / steady, 6) for k, v in summary["steady_phase_seconds"].items()},
        "frames_decoded": driver.frames.decoded,
        "frames_crc_checked": driver.frames.crc_checked,
        "bytes_received": sum(info["bytes"] for info in driver.chunk_info.values()),
        "done": state.done,
        "end_reason": state.end_reason,
        "ack": state.ack_answer,
        "final_status": driver.final_status,
        "controls": controls,
        "control_latency_ms": distribution([c["latency_ms"] for c in controls if c["latency_ms"] is not None], 3),
        "controls_skipped": skipped,
        "per_chunk": [
            {
                "index": c.index,
                "frames": c.frames,
                "first_frame": c.first_frame,
                "arrival_s": seconds_since(c.perf_ns, start),
                "compute_s": None if c.compute_seconds is None else round(c.compute_seconds, 6),
                **driver.chunk_info.get(c.index, {}),
                "phases": c.phases,
            }
            for c in state.chunks
        ],
    }


def add_sessions(summary: dict[str, Any], drivers: list[SessionDriver], started_ns: int | None, wall_s) -> None:
    """The per-session reports and the aggregate into `summary`, also of sessions a failure or a signal cut short."""
    if not drivers:
        return
    reports = [session_report(d) for d in drivers]
    summary["sessions"] = reports
    frames = sum(r["frames"] for r in reports)
    last = max((c.perf_ns for d in drivers for c in d.state.chunks), default=None)
    delivered = None if last is None or started_ns is None else round(frames / ((last - started_ns) / 1e9), 4)
    summary["aggregate"] = {
        "sessions": len(reports),
        "frames": frames,
        "chunks": sum(r["chunks"] for r in reports),
        "wall_s": None if wall_s is None else round(wall_s, 3),
        "delivered_fps": delivered,
        "first_frame_s": distribution_p95([r["first_frame_s"] for r in reports if r["first_frame_s"] is not None]),
    }
    summary["problems"] = [f"session {r['session']}: {p}" for r in reports for p in r["problems"]] + summary["problems"]
    summary["warnings"] += [f"session {r['session']}: {w}" for r in reports for w in r["warnings"]]
