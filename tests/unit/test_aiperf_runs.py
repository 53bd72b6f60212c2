"""Real AIPerf 0.13.0 (from .venv-aiperf) against the real services, through the benchmark runners.

  * a 3-chunk LingBot-World v2 stream session (45 frames), tiny random-weight model on the CPU, lossless;
  * the same session against a broken stream (chunk 1 missing): AIPerf must record the request as failed;
  * a 2-job MiniMax H3 batch run (tiny model on the CPU) with every MP4 re-downloaded and probed.

Skips with a reason when .venv-aiperf is missing (`make aiperf-env` / tools/aiperf/setup_env.sh builds it). AIPerf
has a fixed start-up cost of ~6-8 s per run on 2 cores; the whole file takes well under 3 minutes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "aiperf"
AIPERF = REPO / ".venv-aiperf" / "bin" / "aiperf"
STREAM_CI = TOOLS / "configs" / "stream_lingbot_world_v2_ci.yaml"
BATCH_CI = TOOLS / "configs" / "batch_minimax_h3_ci.yaml"

pytestmark = [
    pytest.mark.skipif(
        not AIPERF.exists(), reason=f"{AIPERF} is missing: run `make aiperf-env` (tools/aiperf/setup_env.sh)"
    ),
    pytest.mark.timeout(420),
]


def run_runner(module: str, *args: str, timeout: float = 400) -> tuple[subprocess.CompletedProcess, dict]:
    summary = Path(args[args.index("--artifact-dir") + 1]) / "telefuser_summary.json"
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    proc = subprocess.run(
        [sys.executable, "-m", f"tools.aiperf.{module}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
    )
    assert summary.exists(), f"no summary; runner output:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc, json.loads(summary.read_text())


def run_tiny_on_cpu(module: str, bench_config: Path, artifacts: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """A runner that starts the service itself with the tiny model on the CPU."""
    args = (
        "--bench-config",
        str(bench_config),
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--artifact-dir",
        str(artifacts),
    )
    return run_runner(module, *args)


def test_stream_bench_tiny_lingbot_lossless(tmp_path):
    artifacts = tmp_path / "stream"
    proc, summary = run_tiny_on_cpu("run_stream_bench", STREAM_CI, artifacts)
    assert proc.returncode == 0 and summary["passed"], (summary.get("problems"), proc.stdout[-3000:])
    (session,) = summary["sessions"]
    assert session["chunks"] == 3 and session["frames"] == 45 and session["done"]["published_frames"] == 45
    assert session["steady_chunks"] == 2 and session["steady_frames"] == 32  # chunk 0 is the warm-up
    assert session["steady_compute_fps"] > 0 and session["client_fps"] > 0 and session["first_frame_latency_s"] > 0
    assert [c["status"] for c in session["controls"]] == [200, 200]
    assert all(c["answer"]["applies_from_chunk"] >= 1 for c in session["controls"])
    aiperf = summary["aiperf"]
    assert aiperf["request_error_rate"]["avg"] == 0 and aiperf["completed_request_count"]["avg"] == 1
    assert aiperf["output_sequence_length"]["avg"] == 45  # one "token" per frame (the bundled tokenizer)
    assert aiperf["inter_chunk_latency"]["count"] == 2  # the gaps between the 3 chunk events
    assert aiperf["time_to_first_token"]["avg"] / 1000 == pytest.approx(session["first_frame_latency_s"], abs=0.01)
    deltas = summary["service_metric_deltas"]
    assert deltas["frames_sent_total"] == deltas["frames_generated_total"] == 45 and deltas["frames_dropped_total"] == 0
    assert deltas["delivery_acks_total{result=match}"] == 1
    raw = [json.loads(line) for line in (artifacts / "profile_export_raw.jsonl").read_text().splitlines()]
    chunk_events = [r for r in raw[0]["responses"] if {"name": "event", "value": "chunk"} in r.get("packets", [])]
    assert len(chunk_events) == 3 and all("image_bytes" in json.dumps(r) for r in chunk_events)  # frames travelled


def broken_stream_app():
    """A stand-in for serve-stream whose SSE stream skips chunk 1 (and publishes only what it sent)."""
    app = FastAPI()
    sent = {"frames": 0}

    @app.get("/v1/service/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/service/metrics")
    async def metrics():
        return PlainTextResponse("")

    @app.post("/v1/stream/sessions")
    async def create(request: Request):
        await request.body()
        return JSONResponse({"session_id": "broken", "total_chunks": 3, "total_frames": 45}, status_code=201)

    @app.get("/v1/stream/sessions/{sid}/events")
    async def events(sid: str):
        async def stream():
            first = 0
            for index, frames in ((0, 13), (2, 16)):
                await asyncio.sleep(0.2)
                data = {
                    "type": "chunk",
                    "chunk": index,
                    "frames": frames,
                    "first_frame": first,
                    "measurement": {"index": index, "frames": frames, "compute_seconds": 0.2},
                }
                yield f"id: {index}\nevent: chunk\ndata: {json.dumps(data)}\n\n"
                first += frames
            sent["frames"] = first
            done = {"type": "done", "published_frames": first, "chunks": 2, "reason": "completed", "dropped_frames": 0}
            yield f"event: done\ndata: {json.dumps(done)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/stream/sessions/{sid}/control")
    async def control(sid: str, request: Request):
        return {"keys": (await request.json())["keys"], "applies_from_chunk": 1}

    @app.post("/v1/stream/sessions/{sid}/ack")
    async def ack(sid: str, request: Request):
        acked = (await request.json())["published_frames"]
        return {"published_frames": sent["frames"], "acked_frames": acked, "match": acked == sent["frames"]}

    @app.delete("/v1/stream/sessions/{sid}")
    async def delete(sid: str):
        return Response(status_code=204)

    return app


def test_stream_bench_missing_chunk_fails_in_aiperf(tmp_path):
    from telefuser.serving.common.local_server import serve_in_thread

    artifacts = tmp_path / "broken"
    with serve_in_thread(broken_stream_app()) as url:
        proc, summary = run_runner(
            "run_stream_bench",
            "--bench-config",
            str(STREAM_CI),
            "--service-url",
            url,
            "--artifact-dir",
            str(artifacts),
        )
    assert proc.returncode == 1 and not summary["passed"]
    # AIPerf itself recorded the session as a failed request (and, every request having failed, wrote no summary)
    (record,) = [json.loads(line) for line in (artifacts / "profile_export.jsonl").read_text().splitlines()]
    assert record["error"]["type"] == "LosslessCheckError"
    assert "missing chunk(s) 1: received 2 distinct of 3" in record["error"]["message"]
    assert "received 29 frames; the request asked for 45" in record["error"]["message"]
    assert not (artifacts / "profile_export_aiperf.json").exists()
    text = "\n".join(summary["problems"])
    assert "request 0 failed in AIPerf: LosslessCheckError" in text and "missing chunk(s) 1" in text, text


def test_batch_tiny_minimax_two_jobs(tmp_path):
    artifacts = tmp_path / "batch"
    proc, summary = run_tiny_on_cpu("run_batch_bench", BATCH_CI, artifacts)
    assert proc.returncode == 0 and summary["passed"], (summary.get("problems"), proc.stdout[-3000:])
    aiperf = summary["aiperf"]
    assert aiperf["request_error_rate"]["avg"] == 0 and aiperf["completed_request_count"]["avg"] == 2
    assert aiperf["video_inference_time"]["count"] == 2 and aiperf["video_peak_memory"]["avg"] > 0
    jobs = summary["jobs"]
    assert len(jobs) == 2 and len({j["id"] for j in jobs}) == 2
    for job in jobs:
        video = job["video"]
        assert video["frames"] == job["final"]["frames"] > 0 and video["audio_stream"], job
    assert summary["service_metric_deltas"]["jobs_completed_total"] == 2
