"""The aiperf-free parts of the AIPerf plugin (tools/aiperf/telefuser_aiperf): SSE parsing, the session state machine,
the lossless checks, summary statistics, option handling and the post-run artifact checks.

Runs in the engine's venv, which has no aiperf: these modules must never import it (checked below).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
from tools.aiperf.telefuser_aiperf import artifacts, batch, controls, lossless, session, summary
from tools.aiperf.telefuser_aiperf.lossless import ChunkObservation, check_chunk_indices
from tools.aiperf.telefuser_aiperf.session import StreamSession, split_options
from tools.aiperf.telefuser_aiperf.sse import SSEEvent, SSEParser

FRAMES = [13, 16, 16]  # LingBot-World v2: 13 frames, then 16 per chunk
CREATE = {"session_id": "s1", "total_chunks": 3, "total_frames": 45}


def test_pure_modules_do_not_import_aiperf():
    for module in (artifacts, batch, controls, lossless, session, summary):
        assert module.__name__.startswith("tools.aiperf.telefuser_aiperf.")
    assert not any(name == "aiperf" or name.startswith("aiperf.") for name in sys.modules)


# ---- SSE ------------------------------------------------------------------------------------------------------------
def chunk_data(index: int, frames: int, first: int, compute: float | None = 1.0) -> dict:
    data = {"type": "chunk", "chunk": index, "frames": frames, "first_frame": first, "checksum": "00000000"}
    if compute is not None:
        data["measurement"] = {"index": index, "frames": frames, "compute_seconds": compute, "phases": {"dit": compute}}
    return data


def sse_text(event: str, data: dict, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n"


def test_sse_parser_pieces_crlf_comments_and_multiline_data():
    stream = (
        ": telefuser stream session=s1\n\n"
        + sse_text("chunk", chunk_data(0, 13, 0), 0)
        + ": keep-alive\r\n\r\n"
        + "event: note\r\ndata: line one\r\ndata: line two\r\n\r\n"
        + sse_text("done", {"published_frames": 13})
    )
    raw = stream.encode()
    parser, events = SSEParser(), []
    for i in range(0, len(raw), 7):  # arbitrary cuts, including inside CRLF pairs and inside JSON
        events += parser.feed(raw[i : i + 7], perf_ns=i)
    events += parser.close(perf_ns=len(raw))
    kinds = [("comment" if e.is_comment else e.event) for e in events]
    assert kinds == ["comment", "chunk", "comment", "note", "done"]
    assert events[1].json()["frames"] == 13 and events[1].id == "0"
    assert events[3].data == "line one\nline two"
    # the chunk event is stamped with the arrival of the piece that completed it
    end_of_chunk = raw.index(b"\n\n", raw.index(b"event: chunk")) + 2
    assert events[1].perf_ns == ((end_of_chunk - 1) // 7) * 7


def test_sse_parser_event_without_final_blank_line():
    parser = SSEParser()
    assert parser.feed(b'event: done\ndata: {"published_frames": 1}', 5) == []
    (event,) = parser.close(9)
    assert event.event == "done" and event.json() == {"published_frames": 1} and event.perf_ns == 9


# ---- the session state machine and the lossless checks ------------------------------------------------------------
def run_session(indices_frames, *, done_frames=None, requested=45, done=True, create=CREATE, extra_events=()):
    """Feed a session `(index, frames)` chunk events 1 s apart, then done; returns the StreamSession."""
    state = StreamSession(split_options({"num_frames": requested}), start_ns=0)
    state.created(dict(create))
    first = 0
    for n, (index, frames) in enumerate(indices_frames):
        event = SSEEvent(perf_ns=(n + 1) * 10**9, event="chunk", data=json.dumps(chunk_data(index, frames, first)))
        assert state.on_event(event) == "chunk"
        first += frames
    for event in extra_events:
        state.on_event(event)
    if done:
        published = sum(f for _, f in indices_frames) if done_frames is None else done_frames
        data = {
            "type": "done",
            "published_frames": published,
            "chunks": create["total_chunks"],
            "reason": "completed",
            "dropped_frames": 0,
        }
        assert state.on_event(SSEEvent(perf_ns=10**10, event="done", data=json.dumps(data))) == "done"
    else:
        state.stream_ended("the event stream ended before the done event")
    return state


def test_good_sequence_passes():
    state = run_session(list(enumerate(FRAMES)))
    assert state.lossless_problems() == []
    assert state.counted_frames == 45
    assert state.record_ack({"acked_frames": 45, "match": True, "published_frames": 45}, 200) == []
    assert state.problems() == []


def test_missing_chunk_fails_clearly():
    state = run_session([(0, 13), (2, 16)])  # chunk 1 never arrived; the service published what it sent
    problems = state.lossless_problems()
    assert any("missing chunk(s) 1: received 2 distinct of 3" in p for p in problems), problems
    assert any("received 29 frames; the request asked for 45" in p for p in problems), problems


def test_duplicated_chunk_fails_clearly():
    state = run_session([(0, 13), (1, 16), (1, 16), (2, 16)], done_frames=45)
    problems = state.lossless_problems()
    assert any("duplicated chunk(s) 1 (x2)" in p for p in problems), problems
    assert any("sum of chunk frames 61 != done.published_frames 45" in p for p in problems), problems


def test_short_frame_count_fails_clearly():
    state = run_session([(0, 13), (1, 16), (2, 10)])
    problems = state.lossless_problems()
    assert problems == ["received 39 frames; the request asked for 45"], problems


def test_out_of_order_chunk_fails_clearly():
    state = run_session([(0, 13), (2, 16), (1, 16)])
    problems = state.lossless_problems()
    assert any("out-of-order chunk: chunk 1 arrived after chunk 2 (event #2)" in p for p in problems), problems


def test_sum_of_frames_must_equal_published_frames():
    state = run_session(list(enumerate(FRAMES)), done_frames=48)
    assert state.lossless_problems() == ["sum of chunk frames 45 != done.published_frames 48"]


def test_stream_without_done_and_service_close_fail():
    state = run_session([(0, 13)], done=False)
    assert "the event stream ended before the done event" in state.lossless_problems()
    closed = SSEEvent(perf_ns=5, event="closed", data=json.dumps({"type": "closed", "reason": "shutdown"}))
    state = StreamSession(split_options({"num_frames": 45}), 0)
    state.created(CREATE)
    assert state.on_event(closed) == "closed"
    assert any("closed the stream (reason 'shutdown') before done" in p for p in state.lossless_problems())


def test_ack_mismatch_and_dropped_frames_fail():
    state = run_session(list(enumerate(FRAMES)))
    assert state.record_ack({"acked_frames": 45, "match": False}, 200)
    assert state.record_ack(None, 409) == ["delivery ack refused: status 409, answer None"]
    done = {"published_frames": 45, "chunks": 3, "reason": "completed", "dropped_frames": 16}
    chunks = [ChunkObservation(i, f, i) for i, f in enumerate(FRAMES)]
    assert "the service dropped 16 frame(s) (done.dropped_frames)" in lossless.check_session(chunks, done)


def test_chunk_index_messages_for_long_gaps_stay_readable():
    indices = [0, 1, 2] + list(range(10, 60))
    assert check_chunk_indices(indices, expected_chunks=60) == ["missing chunk(s) 3-9: received 53 distinct of 60"]
    assert check_chunk_indices([0, 1, 2], expected_chunks=5) == ["missing chunk(s) 3-4: received 3 distinct of 5"]
    assert check_chunk_indices(list(range(60)), expected_chunks=60) == []


def test_images_in_events_are_counted():
    data = chunk_data(0, 13, 0)
    data["image_bytes"] = [100] * 12
    chunk = ChunkObservation.from_event(data, 1)
    assert lossless.check_images([chunk]) == ["chunk 0 declares 13 frames but carried 12 image(s)"]


# ---- summary statistics -------------------------------------------------------------------------------------------
def test_summary_statistics_on_known_numbers():
    computes = [3.0, 1.0, 2.0, 1.0, 4.0]  # chunk 0 (warm-up) is slow and must not count
    frames = [13, 16, 16, 16, 16]
    chunks = [
        ChunkObservation(i, f, (i + 2) * 10**9, compute_seconds=c, phases={"dit": c / 2, "vae": c / 2})
        for i, (f, c) in enumerate(zip(frames, computes))
    ]
    assert summary.steady_compute_fps(chunks) == 64 / 8.0  # 4 x 16 frames over 1 + 2 + 1 + 4 s
    assert summary.steady_compute_fps(chunks, warmup_chunks=0) == 77 / 11.0
    steady = [1.0, 2.0, 1.0, 4.0]
    assert summary.p50(steady) == statistics.median(steady) == 1.5
    assert summary.p90(steady) == sorted(steady)[int(0.9 * (4 - 1))] == 2.0
    out = summary.summarize_session(chunks, start_ns=0, warmup_chunks=1, target_fps=16)
    assert out["chunk_compute_s"] == {"count": 4, "p50": 1.5, "p90": 2.0, "max": 4.0, "mean": 2.0}
    assert out["steady_compute_fps"] == 8.0 and out["realtime_factor"] == 0.5
    assert out["client_fps"] == 16.0  # 64 frames after chunk 0 over the 4 s between first and last arrival
    assert out["first_frame_latency_s"] == 2.0
    assert out["chunk_interval_s"]["max"] == 1.0
    assert out["steady_phase_seconds"] == {"dit": 4.0, "vae": 4.0}
    assert out["warmup_chunk_compute_s"] == [3.0]
    nine = [float(v) for v in range(1, 11)]
    assert summary.p90(nine) == 9.0 and summary.p50(nine) == 5.5


# ---- options and control traces -----------------------------------------------------------------------------------
def test_split_options_builds_the_wire_body_and_keeps_harness_options_off_it(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"controls": [{"delay_s": 1, "keys": ["w"]}, {"after_chunk": 2, "keys": []}]}))
    options = split_options(
        [("num_frames", "957"), ("fps", 16), ("seed", "7"), ("lossless", "true"), ("controls", str(trace))],
        {"resolution": "832x480", "codec": "png", "frames_in_events": True},
    )
    assert options.body("a walk", "data:image/png;base64,AAAA") == {
        "prompt": "a walk",
        "image": "data:image/png;base64,AAAA",
        "codec": "png",
        "config": {"seed": 7, "resolution": "832x480", "num_frames": 957, "fps": 16},
    }
    assert options.requested_frames == 957 and options.harness["lossless"] is True
    assert options.events_query() == "?frames=1&status=1"
    assert [(s.keys, s.delay_s, s.after_chunk) for s in options.controls] == [(("W",), 1.0, None), ((), None, 2)]
    with pytest.raises(ValueError, match="unknown telefuser_stream option"):
        split_options({"num_frame": 45})
    with pytest.raises(ValueError, match="unknown key 'Q'"):
        controls.parse_controls([{"delay_s": 0, "keys": ["Q"]}])
    with pytest.raises(ValueError, match="exactly one of"):
        controls.parse_controls([{"keys": ["W"]}])


def test_bundled_control_traces_parse():
    for name in ("stream_controls_1min.json", "stream_controls_ci.json"):
        steps = controls.parse_controls(REPO / "tools/aiperf/data" / name)
        assert steps, name
    one_minute = controls.parse_controls(REPO / "tools/aiperf/data/stream_controls_1min.json")
    assert all(s.delay_s is not None and s.delay_s <= 40 for s in one_minute)


# ---- post-run artifact checks -------------------------------------------------------------------------------------
def write_artifacts(directory: Path, *, error_rate=0.0, partial=False, records=None, count=1):
    directory.mkdir(parents=True, exist_ok=True)
    profile = {
        "request_error_rate": {"avg": error_rate},
        "request_count": {"avg": count},
        "completed_request_count": {"avg": count},
        "was_cancelled": False,
        "is_complete": True,
        "error_summary": [],
        "request_latency": {"unit": "ms", "avg": 3000.0},
    }
    (directory / artifacts.PROFILE_JSON).write_text(json.dumps(profile))
    (directory / artifacts.READY_JSON).write_text(
        json.dumps({"ready": True, "was_cancelled": False, "partial": partial})
    )
    lines = [json.dumps(r) for r in (records or [])]
    (directory / artifacts.RAW_JSONL).write_text("\n".join(lines) + "\n")


def raw_record(indices_frames, *, ack_match=True):
    responses = [{"perf_ns": 5, "text": json.dumps(CREATE), "content_type": "application/json"}]
    first = 0
    for n, (index, frames) in enumerate(indices_frames):
        data = json.dumps(chunk_data(index, frames, first, compute=0.5))
        responses.append(
            {
                "perf_ns": (n + 1) * 10**9,
                "packets": [
                    {"name": "id", "value": str(index)},
                    {"name": "event", "value": "chunk"},
                    {"name": "data", "value": data},
                ],
            }
        )
        first += frames
    done = {"type": "done", "published_frames": first, "chunks": 3, "reason": "completed", "dropped_frames": 0}
    responses.append(
        {
            "perf_ns": 9 * 10**9,
            "packets": [{"name": "event", "value": "done"}, {"name": "data", "value": json.dumps(done)}],
        }
    )
    report = {
        "telefuser_harness": {
            "harness": {"lossless": True},
            "ack": {"acked_frames": first, "match": ack_match},
            "controls": [{"number": 0, "status": 200}],
            "problems": [],
        }
    }
    responses.append({"perf_ns": 9 * 10**9 + 1, "text": json.dumps(report)})
    return {"metadata": {"benchmark_phase": "profiling"}, "start_perf_ns": 0, "responses": responses}


def service_deltas(match: int, **counters: float) -> dict[str, float]:
    deltas = {"frames_dropped_total": 0, "chunks_dropped_total": 0, "control_errors_total": 0, **counters}
    deltas["delivery_acks_total{result=match}"] = match
    return deltas


def test_check_stream_run_passes_a_lossless_run(tmp_path):
    write_artifacts(tmp_path, records=[raw_record(list(enumerate(FRAMES)))])
    deltas = service_deltas(frames_sent_total=45, frames_generated_total=45, match=1)
    result, problems = artifacts.check_stream_run(
        tmp_path, expected_frames=45, planned_requests=1, target_fps=16, service_deltas=deltas
    )
    assert problems == []
    assert result["lossless"]["passed"]
    assert result["headline"]["steady_compute_fps"] == 32.0  # 2 x 16 frames over 2 x 0.5 s
    assert result["headline"]["client_fps"] == 16.0  # 32 frames over the 2 s from chunk 0 to chunk 2


def test_check_stream_run_reports_every_broken_criterion(tmp_path):
    write_artifacts(tmp_path, error_rate=100.0, partial=True, records=[raw_record([(0, 13), (2, 16)], ack_match=False)])
    deltas = service_deltas(
        frames_dropped_total=16, chunks_dropped_total=1, frames_sent_total=29, frames_generated_total=45, match=0
    )
    _, problems = artifacts.check_stream_run(tmp_path, expected_frames=45, planned_requests=1, service_deltas=deltas)
    text = "\n".join(problems)
    for needle in (
        "request_error_rate is 100% (must be 0)",
        "partial false",
        "missing chunk(s) 1",
        "received 29 frames; the request asked for 45",
        "delivery ack",
        "frames_dropped_total must stay 0",
        "frames_sent_total grew by 29 but frames_generated_total by 45",
    ):
        assert needle in text, (needle, problems)


def test_prometheus_parsing_and_deltas():
    before = artifacts.parse_prometheus(
        '# HELP x\ntelefuser_stream_frames_sent_total 10\ntelefuser_stream_delivery_acks_total{result="match"} 1\n'
    )
    after = artifacts.parse_prometheus(
        "telefuser_stream_frames_sent_total 55\ntelefuser_stream_frames_generated_total 45\n"
        'telefuser_stream_delivery_acks_total{result="match"} 2\n'
        'telefuser_stream_delivery_acks_total{result="mismatch"} 0\n'
    )
    deltas = artifacts.stream_service_deltas(before, after)
    assert deltas["frames_sent_total"] == 45 and deltas["frames_generated_total"] == 45
    assert deltas["delivery_acks_total{result=match}"] == 1 and deltas["frames_dropped_total"] == 0


def test_batch_jobs_from_raw_and_video_checks():
    final = {"id": "video_1", "status": "completed", "frames": 22, "inference_time_s": 0.5, "peak_memory_mb": 100.0}
    record = {
        "metadata": {"benchmark_phase": "profiling", "request_start_ns": 0, "request_end_ns": 2 * 10**9},
        "responses": [
            {"perf_ns": 1, "text": json.dumps({"id": "video_1", "status": "queued"})},
            {"perf_ns": 2, "text": json.dumps(final)},
        ],
    }
    (job,) = batch.jobs_from_raw([record])
    assert job["id"] == "video_1" and job["final"]["status"] == "completed"
    assert batch.check_video({"video_stream": True, "audio_stream": True, "frames": 22}, job["final"]) == []
    assert batch.check_video({"video_stream": True, "audio_stream": False, "frames": 21}, job["final"]) == [
        "no audio stream",
        "21 frames decoded; the job reports 22",
    ]


def test_a_service_that_never_gets_healthy_is_stopped_not_left_running(tmp_path):
    import argparse
    import os
    import sys
    import time

    from tools.aiperf.telefuser_aiperf.runner import start_service

    pid_file = tmp_path / "pid"
    # a "service" in its own session that never answers health: it must not outlive the failed start
    cmd = [
        sys.executable,
        "-c",
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)",
    ]
    args = argparse.Namespace(threads=None, startup_timeout=2.0)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not answer 200 status ok within 2 s"):
        start_service(args, cmd, tmp_path, "http://127.0.0.1:9", {})
    assert time.monotonic() - started < 30
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone
