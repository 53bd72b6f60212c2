"""Multi-rank video serving: rank 0 serves and runs the queue, the follower replays every job with the same request.

On 2 gloo ranks: the follower runs exactly rank 0's jobs (same arguments, same order), a cancelled job stops at the
same step on both ranks (the cancel decision is broadcast), bad requests never reach the follower, only rank 0
writes files, and a job's keyframes reach the follower byte for byte (it never reads the artifact store). Then
`telefuser serve` under torchrun with the real tiny MiniMax H3 model (Ulysses 2): a text job, and a job with a
keyframe and a LoRA from --lora-dir, merged on both ranks.
"""

from __future__ import annotations

import signal
import time

import torch.distributed as dist


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def _serve_and_follow(ctx):
    import tempfile
    from pathlib import Path

    from fastapi.testclient import TestClient

    from telefuser.serving.video.app import create_video_app
    from telefuser.serving.video.fake import FakeVideoRunner
    from telefuser.serving.video.replay import FollowingRunner, follow_runner

    fake = FakeVideoRunner(step_delay_s=0.02)
    group = dist.new_group(backend="gloo")  # as `telefuser serve` does: a CPU control group
    if ctx.rank != 0:
        followed = follow_runner(fake, group)
        return fake.calls, fake.steps_run, followed, None
    leader = FollowingRunner(fake, group, heartbeat_s=0.2)
    try:
        with tempfile.TemporaryDirectory() as out, TestClient(create_video_app(leader, output_dir=out)) as client:
            bad = client.post("/v1/videos", json={"prompt": "p", "size": "101x64"})  # odd: no H.264 4:2:0
            assert bad.status_code == 422
            one = client.post(
                "/v1/videos", json={"prompt": "one", "size": "64x32", "seconds": 0.2, "steps": 4, "seed": 3}
            ).json()["id"]
            _wait(lambda: client.get(f"/v1/videos/{one}").json()["status"] == "completed")
            time.sleep(0.8)  # idle: heartbeat pings keep the follower's blocking broadcast alive
            two = client.post("/v1/videos", json={"prompt": "two", "steps": 300}).json()["id"]
            _wait(lambda: client.get(f"/v1/videos/{two}").json()["progress"] > 0)
            assert client.delete(f"/v1/videos/{two}").json()["status"] == "cancelled"
            _wait(lambda: client.get("/v1/service/health").json()["running"] is None)
            stopped = client.get(f"/v1/videos/{two}").json()["cancelled_at_step"]
            files = sorted(p.name for p in Path(out).iterdir())
        assert files == sorted([f"{one}.json", f"{one}.mp4", f"{two}.json"]), files
        assert leader.pings >= 2, leader.pings
    finally:
        leader.shutdown()
    return fake.calls, fake.steps_run, None, stopped


def test_follower_replays_rank0_jobs_and_cancels_at_the_same_step(ranks2):
    (calls0, steps0, _, stopped), (calls1, steps1, followed, _) = ranks2.run(_serve_and_follow)
    assert [c["prompt"] for c in calls0] == ["one", "two"]
    assert calls0 == calls1  # identical JobRequest arguments, same order
    assert calls0[0] == {
        "prompt": "one",
        "resolution": "64x32",
        "aspect_ratio": "16:9",
        "seconds": 0.2,
        "steps": 4,
        "seed": 3,
        "output_size": None,
        "task": "t2va",
        "preset": None,
        "loras": [],
        "media": [],
    }
    assert steps0 == steps1 and steps0[0] == 3 and 0 < steps0[1] < 299 and steps0[1] == stopped
    assert followed == 6  # create, next_chunk, close per job; the refused request never reached the follower


def _keyframes_reach_the_follower(ctx):
    import tempfile

    from fastapi.testclient import TestClient

    from telefuser.serving.video.app import create_video_app
    from telefuser.serving.video.fake import FakeVideoRunner
    from telefuser.serving.video.replay import FollowingRunner, follow_runner
    from tests.video_media import data_url, png

    fake = FakeVideoRunner(step_delay_s=0.0)
    group = dist.new_group(backend="gloo")
    if ctx.rank != 0:
        follow_runner(fake, group)
        return fake.calls, fake.media_seen
    leader = FollowingRunner(fake, group, heartbeat_s=0.2)
    try:
        with tempfile.TemporaryDirectory() as out, TestClient(create_video_app(leader, output_dir=out)) as client:
            fields = {
                "prompt": "kf",
                "seconds": 0.2,
                "input_reference": data_url(png()),
                "last_frame": data_url(png(32)),
            }
            job = client.post("/v1/videos", json=fields).json()["id"]
            _wait(lambda: client.get(f"/v1/videos/{job}").json()["status"] == "completed")
    finally:
        leader.shutdown()
    return fake.calls, fake.media_seen


def test_a_jobs_keyframes_reach_the_follower_byte_for_byte(ranks2):
    import hashlib

    from tests.video_media import png

    (calls0, seen0), (calls1, seen1) = ranks2.run(_keyframes_reach_the_follower)
    assert calls0 == calls1 and calls0[0]["task"] == "fl2va"
    assert seen0 == seen1 == [[hashlib.sha256(png()).hexdigest(), hashlib.sha256(png(32)).hexdigest()]]


def _launch_tiny(out, *extra: str):
    """`torchrun --nproc-per-node 2 ... serve --config tiny --ulysses-degree 2` with `extra` flags, started: (the
    server process, the URL it serves on). Stop it with SIGINT, what a terminal's Ctrl-C sends to the group (torchrun's
    own exit status is 1 then)."""
    import sys
    from pathlib import Path

    from tools.harness.server_process import ServerProcess

    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "telefuser.serving.video.cli", "serve",
               "--port", "0", "--config", "tiny", "--device", "cpu", "--ulysses-degree", "2", "--output-dir", str(out),
               *extra]  # fmt: skip
    server = ServerProcess(command)
    try:
        url = server.wait_url(90)
        server.wait_for_line("startup complete", 30)
    except BaseException:
        server.kill()
        raise
    return server, url


def test_a_keyframe_and_a_lora_under_torchrun_on_two_ranks(tmp_path):
    """One FL2VA job with a LoRA by name: both ranks read it from --lora-dir and merge it before the run (their
    Ulysses halves of one DiT call would not agree otherwise), and both log the switch."""
    import json

    import httpx

    from tests.video_media import png, write_tiny_lora

    loras = tmp_path / "loras"
    loras.mkdir()
    write_tiny_lora(loras / "style.safetensors", seed=1)
    out = tmp_path / "out"
    server, url = _launch_tiny(out, "--lora-dir", str(loras))
    with server:
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as http:
            fields = {
                "prompt": "waves",
                "size": "64x32",
                "seconds": "0.2",
                "num_inference_steps": "3",
                "lora": "style:0.5",
            }
            job = http.post("/v1/videos", data=fields, files={"input_reference": ("k.png", png(), "image/png")}).json()
            assert job["task"] == "fl2va", job
            _wait(lambda: http.get(f"/v1/videos/{job['id']}").json()["status"] in ("completed", "failed"), 90)
            done = http.get(f"/v1/videos/{job['id']}").json()
            assert done["status"] == "completed", done["error"]
        server.stop(signal.SIGINT, 60)
    text = server.log
    assert text.count("LoRA set switched to: style x 0.5") == 2, text  # rank 0 and the follower
    assert "rank 1: follower stopped after 3 model calls" in text, text
    record = json.loads((out / f"{job['id']}.json").read_text())
    assert record["result"]["metrics"]["loras"]["applied"] == [{"name": "style", "scale": 0.5}]
    assert record["result"]["metrics"]["request"]["conditions"] == {"first": [64, 32]}
    assert not list(out.glob("*.input-*"))


def test_serve_under_torchrun_with_the_tiny_model():
    """`torchrun --nproc-per-node 2 ... serve --config tiny --ulysses-degree 2`: a job completes with audio, then a
    terminal Ctrl-C (SIGINT to the process group) stops rank 0 and, through it, the follower."""
    import json
    import tempfile
    from pathlib import Path

    import httpx

    from telefuser.media import probe_media

    out = Path(tempfile.mkdtemp(prefix="tf-video-"))
    server, url = _launch_tiny(out)
    with server:
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as http:
            job = http.post(
                "/v1/videos", data={"prompt": "waves", "size": "64x32", "seconds": "0.2", "num_inference_steps": "3"}
            ).json()
            _wait(lambda: http.get(f"/v1/videos/{job['id']}").json()["status"] in ("completed", "failed"), 60)
            done = http.get(f"/v1/videos/{job['id']}").json()
            assert done["status"] == "completed", done["error"]
            meta = http.get("/v1/service/metadata").json()["model"]
            assert meta["world_size"] == 2 and meta["ulysses_degree"] == 2
        server.stop(signal.SIGINT, 60)
    text = server.log
    assert "serve exited cleanly" in text, text
    assert "rank 1: follower stopped after 3 model calls" in text, text  # create, next_chunk, close
    info = probe_media(out / f"{job['id']}.mp4")
    assert info.video_frames == done["frames"] and info.sample_rate == 32_000 and info.channels == 2
    assert json.loads((out / f"{job['id']}.json").read_text())["result"]["dit_calls"] == 2
    assert sorted(p.suffix for p in out.iterdir()) == [".json", ".mp4"]  # one job, written once (by rank 0)
