"""Post-run checks over an AIPerf artifact directory and the service's Prometheus metrics. No aiperf imports.

Runs in any Python 3.10+ (the runners use the engine's venv). The stream checks feed the raw export
(`profile_export_raw.jsonl`: every SSE event with its arrival time, written by the telefuser_stream transport)
through the same state machine the transport used, so a lossless verdict never depends on the transport alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .session import StreamSession, split_options
from .sse import SSEEvent
from .summary import distribution, summarize_session

PROFILE_JSON = "profile_export_aiperf.json"
RAW_JSONL = "profile_export_raw.jsonl"
RECORDS_JSONL = "profile_export.jsonl"
READY_JSON = ".aiperf_results_ready.json"
HARNESS_KEY = "telefuser_harness"


# ---- AIPerf's files -------------------------------------------------------------------------------------------------
def load_profile(artifact_dir: Path) -> dict[str, Any]:
    return json.loads((Path(artifact_dir) / PROFILE_JSON).read_text())


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metric(profile: Mapping[str, Any], tag: str, stat: str = "avg") -> float | None:
    value = profile.get(tag)
    if isinstance(value, Mapping):
        value = value.get(stat)
    return value if isinstance(value, (int, float)) else None


def load_raw_records(artifact_dir: Path) -> list[dict[str, Any]]:
    """The raw export; when AIPerf stopped before aggregating it (every request failed), its per-processor parts."""
    artifact_dir = Path(artifact_dir)
    if (artifact_dir / RAW_JSONL).exists():
        return load_jsonl(artifact_dir / RAW_JSONL)
    records: list[dict[str, Any]] = []
    for part in sorted((artifact_dir / "raw_records").glob("*.jsonl")):
        records += load_jsonl(part)
    return sorted(records, key=lambda r: (r.get("metadata") or {}).get("request_start_ns") or 0)


def record_errors(artifact_dir: Path) -> list[str]:
    """The error of every failed request in the per-request export (profile_export.jsonl)."""
    out = []
    for number, record in enumerate(load_jsonl(Path(artifact_dir) / RECORDS_JSONL)):
        error = record.get("error")
        if error:
            out.append(f"request {number} failed in AIPerf: {error.get('type')}: {error.get('message')}")
    return out


def check_completeness(artifact_dir: Path, planned_requests: int) -> list[str]:
    """Request error rate 0, completed == planned, not cancelled, complete, results not partial, no error summary."""
    artifact_dir = Path(artifact_dir)
    problems: list[str] = []
    if not (artifact_dir / PROFILE_JSON).exists():
        missing = f"{artifact_dir / PROFILE_JSON} is missing: AIPerf did not finish (none is written when all failed)"
        return [missing, *record_errors(artifact_dir)]
    profile = load_profile(artifact_dir)
    error_rate = metric(profile, "request_error_rate")
    if error_rate is None:
        errors = metric(profile, "error_request_count") or 0
        error_rate = 0.0 if not errors else 100.0
    if error_rate != 0:
        problems.append(f"request_error_rate is {error_rate:g}% (must be 0)")
    for tag in ("request_count", "completed_request_count"):
        count = metric(profile, tag)
        if count is None or int(count) != planned_requests:
            problems.append(f"{tag} is {count}, planned {planned_requests}")
    if profile.get("was_cancelled") is not False:
        problems.append(f"was_cancelled is {profile.get('was_cancelled')!r}")
    if profile.get("is_complete") is not True:
        problems.append(f"is_complete is {profile.get('is_complete')!r}")
    if profile.get("error_summary"):
        problems.append(f"error_summary is not empty: {json.dumps(profile['error_summary'])[:600]}")
    ready_path = artifact_dir / READY_JSON
    if not ready_path.exists():
        problems.append(f"{READY_JSON} is missing")
    else:
        ready = json.loads(ready_path.read_text())
        if ready.get("ready") is not True or ready.get("partial") is not False or ready.get("was_cancelled"):
            problems.append(f"{READY_JSON} says {ready} (need ready true, partial false, not cancelled)")
    return problems


# ---- stream sessions from the raw export ---------------------------------------------------------------------------
@dataclass
class RawSession:
    record_number: int
    session: StreamSession
    harness: dict[str, Any] | None
    error: Any
    metadata: dict[str, Any] = field(default_factory=dict)


def _event_from_response(response: Mapping[str, Any]) -> SSEEvent:
    fields = [(p.get("name") or "", p.get("value") or "") for p in response.get("packets") or []]
    event = SSEEvent(perf_ns=int(response["perf_ns"]), fields=fields)
    data = []
    for name, value in fields:
        if name == "event":
            event.event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            event.id = value
        elif name == "comment":
            event.comment = value
    event.data = "\n".join(data)
    return event


def sessions_from_raw(records: Iterable[Mapping[str, Any]], expected_frames: int | None) -> list[RawSession]:
    out = []
    for number, record in enumerate(records):
        options = split_options({"num_frames": expected_frames} if expected_frames is not None else {})
        session = StreamSession(options, int(record.get("start_perf_ns") or 0))
        harness = None
        for response in record.get("responses") or []:
            if "packets" in response:
                event = _event_from_response(response)
                try:
                    kind = session.on_event(event)
                except ValueError as exc:
                    session.stream_ended(f"unreadable {event.event!r} event in the raw export: {exc}")
                    break
                if kind in ("done", "fatal", "closed"):
                    continue
            elif isinstance(response.get("text"), str):
                try:
                    body = json.loads(response["text"])
                except json.JSONDecodeError:
                    continue
                if isinstance(body, dict) and HARNESS_KEY in body:
                    harness = body[HARNESS_KEY]
                elif isinstance(body, dict) and "session_id" in body and session.create_answer is None:
                    session.created(body)
        if session.done is None:
            session.stream_ended("no done event in the raw export")
        out.append(RawSession(number, session, harness, record.get("error"), dict(record.get("metadata") or {})))
    return out


def check_stream_sessions(sessions: list[RawSession], planned_requests: int) -> list[str]:
    problems: list[str] = []
    if len(sessions) != planned_requests:
        problems.append(f"the raw export holds {len(sessions)} request(s), planned {planned_requests}")
    for raw in sessions:
        tag = f"request {raw.record_number} (session {raw.session.session_id})"
        if raw.error:
            problems.append(f"{tag}: AIPerf recorded an error: {json.dumps(raw.error)[:600]}")
        problems += [f"{tag}: {p}" for p in raw.session.lossless_problems()]
        harness = raw.harness
        if harness is None:
            problems.append(f"{tag}: no telefuser_harness report (was the telefuser_stream transport used?)")
            continue
        if not harness.get("harness", {}).get("lossless"):
            problems.append(f"{tag}: the request ran without lossless mode")
        ack = harness.get("ack") or {}
        if ack.get("match") is not True or ack.get("acked_frames") != raw.session.counted_frames:
            problems.append(f"{tag}: delivery ack {ack} does not match the {raw.session.counted_frames} frames counted")
        for control in harness.get("controls") or []:
            status = control.get("status")
            if not isinstance(status, int) or not 200 <= status < 300:
                problems.append(f"{tag}: control #{control.get('number')} answered {status}: {control.get('answer')}")
        problems += [f"{tag}: {p}" for p in harness.get("problems") or []]
    return problems


# ---- the service's Prometheus metrics ------------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
        try:
            samples[(match.group(1), labels)] = float(match.group(3).replace("+Inf", "inf"))
        except ValueError:
            continue
    return samples


def sample_sum(samples: Mapping, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def stream_service_deltas(before: Mapping, after: Mapping, prefix: str = "telefuser_stream_") -> dict[str, float]:
    names = (
        "sessions_created_total",
        "chunks_generated_total",
        "chunks_sent_total",
        "chunks_dropped_total",
        "frames_generated_total",
        "frames_sent_total",
        "frames_dropped_total",
        "controls_total",
        "control_errors_total",
        "backpressure_seconds_total",
    )
    deltas = {n: sample_sum(after, prefix + n) - sample_sum(before, prefix + n) for n in names}
    for result in ("match", "mismatch", "missing"):
        deltas[f"delivery_acks_total{{result={result}}}"] = sample_sum(
            after, prefix + "delivery_acks_total", result=result
        ) - sample_sum(before, prefix + "delivery_acks_total", result=result)
    return deltas


def check_stream_service(deltas: Mapping[str, float], sessions: int, frames: int | None) -> list[str]:
    problems = []
    if deltas["frames_dropped_total"] != 0 or deltas["chunks_dropped_total"] != 0:
        problems.append(
            f"the service dropped {deltas['frames_dropped_total']:g} frame(s) / {deltas['chunks_dropped_total']:g} "
            f"chunk(s) (frames_dropped_total must stay 0)"
        )
    if deltas["frames_sent_total"] != deltas["frames_generated_total"]:
        problems.append(
            f"frames_sent_total grew by {deltas['frames_sent_total']:g} but frames_generated_total by "
            f"{deltas['frames_generated_total']:g}"
        )
    if frames is not None and deltas["frames_sent_total"] != frames:
        problems.append(f"frames_sent_total grew by {deltas['frames_sent_total']:g}; the client counted {frames}")
    if deltas["delivery_acks_total{result=match}"] != sessions:
        problems.append(
            f"delivery_acks_total{{result=match}} grew by {deltas['delivery_acks_total{result=match}']:g}, "
            f"expected {sessions}"
        )
    if deltas["control_errors_total"]:
        problems.append(f"control_errors_total grew by {deltas['control_errors_total']:g}")
    return problems


# ---- the whole stream verdict --------------------------------------------------------------------------------------
AIPERF_TAGS = (
    "request_latency",
    "time_to_first_token",
    "inter_chunk_latency",
    "output_sequence_length",
    "output_token_throughput",
    "output_token_throughput_per_user",
    "request_count",
    "completed_request_count",
    "request_error_rate",
    "benchmark_duration",
)


def aiperf_metrics(profile: Mapping[str, Any], tags: Iterable[str] = AIPERF_TAGS) -> dict[str, Any]:
    keep = ("unit", "avg", "p50", "p90", "p99", "min", "max", "count")
    return {t: {k: v for k, v in profile[t].items() if k in keep} for t in tags if isinstance(profile.get(t), Mapping)}


def check_stream_run(
    artifact_dir: Path,
    *,
    expected_frames: int,
    planned_requests: int,
    warmup_chunks: int = 1,
    target_fps: float | None = None,
    service_deltas: Mapping[str, float] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """(summary, problems) of a stream benchmark; problems empty = every lossless check passed."""
    artifact_dir = Path(artifact_dir)
    problems = check_completeness(artifact_dir, planned_requests)
    raw = load_raw_records(artifact_dir)
    if not raw:
        problems.append(f"{artifact_dir / RAW_JSONL} is missing or empty (the config must set artifacts.raw: true)")
    sessions = sessions_from_raw(raw, expected_frames)
    problems += check_stream_sessions(sessions, planned_requests)
    frames = sum(s.session.counted_frames for s in sessions)
    if service_deltas is not None:
        problems += check_stream_service(service_deltas, len(sessions), frames)
    per_session = []
    for raw_session in sessions:
        s = raw_session.session
        per_session.append(
            {
                "session_id": s.session_id,
                **summarize_session(s.chunks, start_ns=s.start_ns, warmup_chunks=warmup_chunks, target_fps=target_fps),
                "done": s.done,
                "controls": (raw_session.harness or {}).get("controls"),
                "controls_skipped": (raw_session.harness or {}).get("controls_skipped"),
            }
        )
    summary: dict[str, Any] = {
        "kind": "stream",
        "artifact_dir": str(artifact_dir),
        "expected_frames_per_session": expected_frames,
        "planned_sessions": planned_requests,
        "sessions": per_session,
        "aiperf": aiperf_metrics(load_profile(artifact_dir)) if (artifact_dir / PROFILE_JSON).exists() else {},
        "service_metric_deltas": dict(service_deltas) if service_deltas is not None else None,
    }
    if per_session:
        first = per_session[0]
        summary["headline"] = {
            "steady_compute_fps": first["steady_compute_fps"],
            "client_fps": first["client_fps"],
            "first_frame_latency_s": first["first_frame_latency_s"],
            "chunk_compute_s": first["chunk_compute_s"],
            "chunk_interval_s": first["chunk_interval_s"],
        }
        if len(per_session) > 1:
            summary["headline"]["first_frame_latency_all_s"] = distribution(
                [p["first_frame_latency_s"] for p in per_session if p["first_frame_latency_s"] is not None]
            )
    summary["lossless"] = {"passed": not problems, "problems": problems}
    return summary, problems
