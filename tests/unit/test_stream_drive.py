"""tools/bench/stream_drive end to end: the tiny LingBot-World v2 service on the CPU driven through the CI session,
and a service that loses a chunk, one that stalls and a URL with nothing behind it, each failing with a clear
message."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.fake import FakeSessionFactory
from telefuser.serving.stream.events import ChunkItem
from telefuser.serving.stream.session import StreamSessionState

REPO = Path(__file__).resolve().parents[2]
CI_BENCH = REPO / "tools" / "aiperf" / "configs" / "stream_lingbot_world_v2_ci.yaml"

from tools.aiperf.telefuser_aiperf.controls import parse_controls
from tools.aiperf.telefuser_aiperf.runner import endpoint_extra, free_port, load_bench_config


def run_tool(*args: str, output: Path, timeout: float) -> tuple[subprocess.CompletedProcess, dict, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.stream_drive", *args, "--output", str(output), "--progress", "lines"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return proc, json.loads(output.read_text()), time.monotonic() - started


def test_tiny_lingbot_ci_session_is_lossless_end_to_end(tmp_path):
    extra = endpoint_extra(load_bench_config(CI_BENCH))
    frames = int(extra["num_frames"])
    chunks = 1 + (frames - 13) // 16  # LingBot-World v2: 13 frames, then 16 a chunk
    steps = parse_controls(extra["controls"], base_dir=REPO)
    proc, summary, _ = run_tool(
        "--config", "tiny", "--device", "cpu", "--resolution", "64x48", "--threads", "1",
        "--bench-config", str(CI_BENCH), output=tmp_path / "ci.json", timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary["passed"] is True and summary["problems"] == [], summary["problems"]
    (session,) = summary["sessions"]
    assert session["passed"] and session["problems"] == []
    assert (session["frames"], session["requested_frames"]) == (frames, frames) == (45, 45)
    assert (session["chunks"], session["expected_chunks"]) == (chunks, chunks) == (3, 3)
    assert [c["index"] for c in session["per_chunk"]] == list(range(chunks))
    assert [c["first_frame"] for c in session["per_chunk"]] == [0, 13, 29]
    assert session["frames_decoded"] == frames and session["bytes_received"] > 0
    assert session["first_frame_s"] > 0 and session["first_frame_s"] >= session["create_s"] > 0
    assert session["session_fps"] > 0 and session["steady_fps"] > 0 and session["steady_compute_fps"] > 0
    interval = session["chunk_interval_s"]
    assert interval["count"] == chunks - 1 and 0 < interval["p50"] <= interval["p95"] <= interval["max"]
    assert set(session["steady_phase_mean_s"]) >= {"dit_s", "decode_s"}
    assert session["ack"]["match"] is True and session["ack"]["acked_frames"] == frames
    final = session["final_status"]
    assert (final["published_frames"], final["acked_frames"], final["ack_match"]) == (frames, frames, True)
    assert [c["keys"] for c in session["controls"]] == [list(s.keys) for s in steps]
    assert all(c["confirmed"] for c in session["controls"])
    deltas = summary["service_metrics"]["deltas"]
    assert deltas["frames_sent_total"] == deltas["frames_generated_total"] == frames
    assert deltas["delivery_acks_total{result=match}"] == 1 and deltas["frames_dropped_total"] == 0
    assert summary["service_metrics"]["chunk_compute_mean_s"] > 0
    assert summary["service"]["started_here"] and summary["service"]["exit_code"] == 0
    assert "lossless verdict     PASSED" in proc.stdout and "first frame s" in proc.stdout
    assert "session 1: chunk 3/3" in proc.stderr


def _dropping_events(original):
    async def events(self, keepalive_s=None):  # a broken service: chunk 1 never reaches the client
        async for item in original(self, keepalive_s):
            if isinstance(item, ChunkItem) and item.index == 1:
                continue
            yield item

    return events


def _stalling_events(original):
    async def events(self, keepalive_s=None):  # a hung service: chunk 0, then silence until the client leaves
        async for item in original(self, keepalive_s):
            yield item
            if isinstance(item, ChunkItem):
                while not self.closed:
                    await asyncio.sleep(0.05)
                return

    return events


@pytest.mark.parametrize(
    ("fault", "patch", "expected"),
    [
        ("drop", _dropping_events, ["missing chunk(s) 1", "frames_sent_total grew by 29 but frames_generated_total"]),
        ("stall", _stalling_events, ["no message from the service for 2 s while waiting for chunk 1 of 3"]),
    ],
)
def test_a_faulty_service_fails_the_drive_with_the_reason(tmp_path, monkeypatch, fault, patch, expected):
    monkeypatch.setattr(StreamSessionState, "events", patch(StreamSessionState.events))
    app = create_stream_app(FakeSessionFactory(delay_s=0.0), max_sessions=1, ack_timeout_s=2.0)
    with serve_in_thread(app) as base:
        proc, summary, seconds = run_tool(
            "--url", base, "--bench-config", str(CI_BENCH), "--resolution", "64x48", "--stall-timeout", "2",
            output=tmp_path / f"{fault}.json", timeout=60,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert summary["passed"] is False and seconds < 30
    problems = "\n".join(summary["problems"])
    for text in expected:
        assert text in problems, problems
        assert text in proc.stdout
    assert "lossless verdict     FAILED" in proc.stdout


def test_a_url_with_no_service_fails_within_the_connect_timeout(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    proc, summary, seconds = run_tool("--url", url, "--connect-timeout", "2", output=tmp_path / "bad.json", timeout=60)
    assert proc.returncode == 1 and summary["passed"] is False and seconds < 20, proc.stdout + proc.stderr
    (problem,) = summary["problems"]
    assert f"GET {url}/v1/service/health did not answer 200 status ok within 2 s" in problem
    assert "Connection refused" in problem and problem in proc.stdout
