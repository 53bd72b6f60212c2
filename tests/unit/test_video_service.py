"""The batch video service (`telefuser serve`): /v1/videos with the tiny MiniMax H3 model and a fake runner.

Requests are sent the way AIPerf's `video_generation` endpoint sends them (multipart/form-data built like aiohttp's
FormData, or JSON), then polled to completion. The fake runner covers queueing, cancellation, persistence and errors
without the model's start-up cost; the real tiny model covers the MP4 with audio, progress and timings.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from telefuser.media import probe_media
from telefuser.pipelines.hooks import StepHooks
from telefuser.pipelines.minimax_h3.shapes import align_frame_count
from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.contract import JobCancelled, JobRequest
from telefuser.serving.video.fake import FakeVideoRunner
from telefuser.serving.video.jobs import RecordFiles, VideoJob, new_job_id
from tools.harness.server_process import ServerProcess
from tests.video_runner_args import tiny_runner_args

REPO = Path(__file__).resolve().parents[2]
SHORT = align_frame_count(round(0.2 * 24))  # the frames the model makes for a 0.2 s request (its grid snaps up)
TINY = {"prompt": "a red fox in snow", "model": "MiniMax-H3", "size": "64x32", "seconds": "0.2",
        "num_inference_steps": "3", "seed": "7"}  # fmt: skip


def aiohttp_form(fields: dict[str, object]) -> tuple[bytes, dict[str, str]]:
    """The body and headers aiohttp.FormData(default_to_multipart=True) produces for text fields (AIPerf's
    `_build_form_data`: values str()-ed, booleans lower-cased; a uuid4-hex boundary; per part a text/plain
    Content-Type then the Content-Disposition; CRLF line ends; no Content-Length per part)."""
    boundary = uuid.uuid4().hex
    out = b""
    for name, value in fields.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += (
            f"--{boundary}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f'Content-Disposition: form-data; name="{name}"\r\n\r\n'
        ).encode()
        out += text.encode() + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def post_form(client, fields) -> httpx.Response:
    body, headers = aiohttp_form(fields)
    return client.post("/v1/videos", content=body, headers=headers)


def wait_for(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def poll(client, video_id: str, timeout=20.0, statuses=("completed", "failed")) -> dict:
    seen: list[dict] = []

    def done():
        seen.append(client.get(f"/v1/videos/{video_id}").json())
        return seen[-1]["status"] in statuses

    wait_for(done, timeout, f"{video_id} to reach {statuses}")
    return seen[-1] | {"_history": seen}


def idle(client) -> bool:
    return client.get("/v1/service/health").json()["running"] is None


def parse_metrics(text: str) -> dict[str, float]:
    types, samples = {}, {}
    for line in text.strip().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            family = re.sub(r"(_bucket|_sum|_count)$", "", key.split("{")[0])
            assert family in types or key.split("{")[0] in types, f"undeclared sample {key}"
            samples[key] = float(value)
    return samples


@pytest.fixture(scope="module")
def tiny_runner():
    """The real MiniMax H3 pipeline, tiny random weights, CPU, built the way `telefuser serve` builds it."""
    from telefuser.serving.video.minimax import build_minimax_runner

    runner = build_minimax_runner(tiny_runner_args())
    yield runner
    runner.close()


# -- the real tiny model ------------------------------------------------------------------------------------------


def test_multipart_as_aiperf_sends_it_completes_with_video_and_audio(tiny_runner, tmp_path):
    app = create_video_app(tiny_runner, output_dir=tmp_path, max_queue=4)
    with TestClient(app) as client:
        r = post_form(client, TINY)
        assert r.status_code == 200, r.text
        created = r.json()
        assert created["object"] == "video" and created["status"] == "queued" and created["progress"] == 0
        assert created["id"].startswith("video_") and created["model"] == "MiniMax-H3"
        assert created["size"] == "64x32" and created["seconds"] == "0.2" and created["prompt"] == TINY["prompt"]
        assert isinstance(created["created_at"], int)
        done = poll(client, created["id"])
        assert done["status"] == "completed", done
        assert done["progress"] == 100 and done["error"] is None and done["completed_at"] >= done["created_at"]
        assert done["inference_time_s"] > 0 and done["peak_memory_mb"] > 0
        assert done["dit_calls"] == 2 and done["frames"] == SHORT and done["duration_s"] == pytest.approx(SHORT / 24)
        assert done["url"].endswith(f"/v1/videos/{created['id']}/content")
        assert Path(done["metrics"]).is_file()

        content = client.get(f"/v1/videos/{created['id']}/content")
        assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    clip = tmp_path / "downloaded.mp4"
    clip.write_bytes(content.content)
    info = probe_media(clip)
    assert (info.video_codec, info.video_frames, info.width, info.height) == ("h264", SHORT, 64, 32)
    assert info.has_audio and info.audio_codec == "aac" and info.sample_rate == 32_000 and info.channels == 2
    assert (tmp_path / f"{created['id']}.mp4").read_bytes() == content.content

    record = json.loads((tmp_path / f"{created['id']}.json").read_text())
    assert (
        record["status"] == "completed" and record["job_request"]["steps"] == 3 and record["job_request"]["seed"] == 7
    )
    assert record["request"]["size"] == "64x32"  # what the client sent, as sent (form text)
    assert record["result"]["metrics"]["dit_calls"]["computed"] == 2  # the pipeline's own metrics()
    assert record["result"]["timings"]["dit_step_s"] and record["result"]["mux_s"] > 0


def test_json_submission_with_a_short_edge_and_aspect_ratio(tiny_runner, tmp_path):
    app = create_video_app(tiny_runner, output_dir=tmp_path)
    with TestClient(app) as client:
        r = client.post(
            "/v1/videos",
            json={
                "prompt": "rain on a tin roof",
                "resolution": 32,
                "aspect_ratio": "1:1",
                "seconds": 0.5,
                "steps": 3,
                "seed": 1,
                "fps": 24,
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["size"] == "32x32" and r.json()["frames"] == 22  # 0.5 s -> 12 frames -> snapped to 17n+5
        done = poll(client, r.json()["id"])
        assert done["status"] == "completed" and done["frames"] == 22
        assert done["audio"] == {"channels": 2, "sample_rate": 32_000, "samples": done["audio"]["samples"]}


def test_a_size_off_the_grid_is_generated_on_it_and_resized_by_the_real_model(tiny_runner, tmp_path):
    app = create_video_app(tiny_runner, output_dir=tmp_path)
    with TestClient(app) as client:
        r = client.post("/v1/videos", json={"prompt": "a kite over dunes", "size": "96x54", "seconds": 0.2})
        assert r.status_code == 200, r.text
        created = r.json()
        assert created["size"] == "96x54" and created["generated_size"] == "128x64" and created["resize"]
        done = poll(client, created["id"])
        assert done["status"] == "completed", done
        content = client.get(f"/v1/videos/{created['id']}/content").content
    clip = tmp_path / "resized.mp4"
    clip.write_bytes(content)
    info = probe_media(clip)
    assert (info.width, info.height, info.video_frames) == (96, 54, SHORT)
    record = json.loads((tmp_path / f"{created['id']}.json").read_text())
    assert record["job_request"]["resolution"] == "128x64" and record["job_request"]["output_size"] == "96x54"
    assert (record["result"]["width"], record["result"]["height"]) == (96, 54)
    assert record["result"]["generated_size"] == "128x64"


def test_minimax_runner_reports_each_denoising_step_and_stops_between_steps(tiny_runner, tmp_path):
    job_request = JobRequest("a lighthouse", "64x32", "16:9", 0.2, 5, 0)
    steps: list[tuple[int, int]] = []
    outcome = tiny_runner.run(job_request, None, StepHooks(progress=lambda d, t: steps.append((d, t))))
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)] and outcome.dit_calls == 4
    assert not list(tmp_path.iterdir())  # output=None (a follower rank) writes nothing

    steps.clear()
    with pytest.raises(JobCancelled) as stopped:
        tiny_runner.run(
            job_request,
            tmp_path / "x.mp4",
            StepHooks(progress=lambda d, t: steps.append((d, t)), cancelled=lambda: len(steps) >= 2),
        )
    assert stopped.value.step == 2 and steps == [(1, 4), (2, 4)] and not (tmp_path / "x.mp4").exists()
    assert tiny_runner.run(job_request, None, StepHooks()).dit_calls == 4  # the hooks do not leak into the next job


# -- queue, progress, failures, cancellation (fake runner) -----------------------------------------------------


def test_progress_increases_while_running(tmp_path):
    app = create_video_app(FakeVideoRunner(step_delay_s=0.03), output_dir=tmp_path)
    with TestClient(app) as client:
        vid = client.post("/v1/videos", json={"prompt": "p", "steps": 11}).json()["id"]
        history = [o["progress"] for o in poll(client, vid)["_history"]]
    assert history == sorted(history) and history[-1] == 100
    assert any(0 < p < 100 for p in history), history


class BrokenRunner(FakeVideoRunner):
    def run(self, job_request, output, hooks):
        hooks.progress(1, 3)
        raise RuntimeError("CUDA out of memory (injected)")


def test_a_failing_job_says_why(tmp_path):
    app = create_video_app(BrokenRunner(), output_dir=tmp_path)
    with TestClient(app) as client:
        vid = client.post("/v1/videos", json={"prompt": "p"}).json()["id"]
        done = poll(client, vid)
        assert done["status"] == "failed" and done["completed_at"] is None
        assert done["error"] == {"code": "generation_failed", "message": "RuntimeError: CUDA out of memory (injected)"}
        assert "inference_time_s" not in done
        r = client.get(f"/v1/videos/{vid}/content")
        assert r.status_code == 409 and "failed" in r.json()["detail"]
        wait_for(lambda: idle(client), what="idle")  # the worker counts a job's end after recording it
        metrics = parse_metrics(client.get("/v1/service/metrics").text)
    assert metrics["telefuser_video_jobs_failed_total"] == 1
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".*"))


def test_full_queue_answers_429_with_retry_after(tmp_path):
    runner = FakeVideoRunner(step_delay_s=0.05)
    app = create_video_app(runner, output_dir=tmp_path, max_queue=1)
    with TestClient(app) as client:
        first = client.post("/v1/videos", json={"prompt": "one", "steps": 200}).json()["id"]
        wait_for(lambda: client.get(f"/v1/videos/{first}").json()["status"] == "in_progress", what="first running")
        second = client.post("/v1/videos", json={"prompt": "two"})
        assert second.status_code == 200 and second.json()["status"] == "queued"
        third = client.post("/v1/videos", json={"prompt": "three"})
        assert third.status_code == 429 and int(third.headers["Retry-After"]) >= 1
        assert "queue full" in third.json()["detail"] and "max_queue=1" in third.json()["detail"]
        health = client.get("/v1/service/health").json()
        assert health["queue_depth"] == 1 and health["running"] == first
        metrics = parse_metrics(client.get("/v1/service/metrics").text)
        assert metrics['telefuser_video_jobs_rejected_total{reason="queue_full"}'] == 1
        assert metrics["telefuser_video_queue_depth"] == 1 and metrics["telefuser_video_jobs_running"] == 1
        for vid in (second.json()["id"], first):
            assert client.delete(f"/v1/videos/{vid}").status_code == 200


def test_delete_cancels_a_queued_and_a_running_job_then_deletes(tmp_path):
    runner = FakeVideoRunner(step_delay_s=0.05)
    app = create_video_app(runner, output_dir=tmp_path, max_queue=2)
    with TestClient(app) as client:
        running = client.post("/v1/videos", json={"prompt": "running", "steps": 100}).json()["id"]
        queued = client.post("/v1/videos", json={"prompt": "queued"}).json()["id"]
        wait_for(lambda: client.get(f"/v1/videos/{running}").json()["progress"] > 0, what="progress")

        r = client.delete(f"/v1/videos/{queued}")
        assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["cancel_reason"] == "client"
        r = client.delete(f"/v1/videos/{running}")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        wait_for(lambda: idle(client), what="the worker to stop")
        stopped = client.get(f"/v1/videos/{running}").json()
        assert stopped["status"] == "cancelled" and 0 < stopped["cancelled_at_step"] < 99
        assert client.get(f"/v1/videos/{running}/content").status_code == 409
        assert [c["prompt"] for c in runner.calls] == ["running"]  # the queued job never ran
        assert json.loads((tmp_path / f"{running}.json").read_text())["status"] == "cancelled"
        assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".*"))

        done = client.post("/v1/videos", json={"prompt": "kept"}).json()["id"]
        assert poll(client, done)["status"] == "completed"
        assert (tmp_path / f"{done}.mp4").is_file()
        for vid in (done, running, queued):  # finished jobs: DELETE removes them and their files
            r = client.delete(f"/v1/videos/{vid}")
            assert r.status_code == 200 and r.json() == {"id": vid, "object": "video.deleted", "deleted": True}
            assert client.get(f"/v1/videos/{vid}").status_code == 404
        assert not list(tmp_path.iterdir())
        assert client.delete(f"/v1/videos/{done}").status_code == 404
        metrics = parse_metrics(client.get("/v1/service/metrics").text)
    assert metrics['telefuser_video_jobs_cancelled_total{reason="client",state="queued"}'] == 1
    assert metrics['telefuser_video_jobs_cancelled_total{reason="client",state="in_progress"}'] == 1
    assert metrics["telefuser_video_jobs_deleted_total"] == 3


# -- persistence ---------------------------------------------------------------------------------------------------


def test_finished_jobs_survive_a_restart_and_shutdown_cancels_the_running_one(tmp_path):
    with TestClient(create_video_app(FakeVideoRunner(step_delay_s=0.05), output_dir=tmp_path)) as client:
        done = client.post("/v1/videos", json={"prompt": "kept", "size": "96x64"}).json()["id"]
        assert poll(client, done)["status"] == "completed"
        before = client.get(f"/v1/videos/{done}").json()
        content = client.get(f"/v1/videos/{done}/content").content
        busy = client.post("/v1/videos", json={"prompt": "interrupted", "steps": 500}).json()["id"]
        wait_for(lambda: client.get(f"/v1/videos/{busy}").json()["status"] == "in_progress", what="running")
    # the lifespan ended: the running job was cancelled at its next step and recorded so
    assert json.loads((tmp_path / f"{busy}.json").read_text())["cancel_reason"] == "shutdown"

    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path)) as client:
        after = client.get(f"/v1/videos/{done}").json()
        assert after == before
        assert client.get(f"/v1/videos/{done}/content").content == content
        cancelled = client.get(f"/v1/videos/{busy}").json()
        assert cancelled["status"] == "cancelled" and cancelled["cancel_reason"] == "shutdown"
        listing = client.get("/v1/videos", params={"order": "asc"}).json()
        assert [v["id"] for v in listing["data"]] == [done, busy] and listing["has_more"] is False


def test_jobs_interrupted_by_a_crash_are_reported_failed(tmp_path):
    store = RecordFiles(tmp_path)
    ids = {}
    for status in ("queued", "in_progress"):  # what a killed server leaves on disk
        job = VideoJob(
            id=new_job_id(),
            model="MiniMax-H3",
            prompt=status,
            request={},
            job_request=JobRequest("p", "64x64", "16:9", 0.2, 4, 0).as_dict(),
            plan={"width": 64, "height": 64, "frames": 5, "fps": 24, "duration_s": 5 / 24, "dit_calls": 3},
            status=status,
        )
        job.touch()
        store.save(job.record())
        ids[status] = job.id
    (tmp_path / f".{ids['in_progress']}.partial.mp4").write_bytes(b"half a file")
    (tmp_path / "notes.json").write_text("{}")  # not a job record: left alone

    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path)) as client:
        for status, vid in ids.items():
            job = client.get(f"/v1/videos/{vid}").json()
            assert job["status"] == "failed" and job["error"]["code"] == "server_restarted"
            message = job["error"]["message"]
            assert "server restarted before the job finished" in message and status in message
        assert client.get("/v1/service/health").json()["jobs"]["failed"] == 2
    assert not (tmp_path / f".{ids['in_progress']}.partial.mp4").exists() and (tmp_path / "notes.json").exists()
    assert json.loads((tmp_path / f"{ids['queued']}.json").read_text())["status"] == "failed"


# -- validation ----------------------------------------------------------------------------------------------------

BAD = [
    ({}, 422, "'prompt' is required"),
    ({"prompt": "   "}, 422, "'prompt' is required"),
    ({"prompt": "p", "size": "big"}, 422, "'size' must be WIDTHxHEIGHT"),
    ({"prompt": "p", "size": "1281x720"}, 422, "both sides must be even (H.264 4:2:0)"),
    ({"prompt": "p", "size": "8x8"}, 422, "at least 16"),
    (
        {"prompt": "p", "size": "32000x32000"},
        422,
        (
            "'size' 32000x32000 is 32000 pixels wide; the limit is "
            "max_width=2,688 (--max-width; model: 2 x the long edge of its "
            "1344x768 canvas)"
        ),
    ),
    ({"prompt": "p", "size": "2688x2688"}, 422, "has 7,225,344 pixels (2688x2688); the limit is max_pixels=4,128,768"),
    ({"prompt": "p", "size": "1344x768", "seconds": 2, "num_frames": 10**6}, 422, "the limit is max_frames="),
    ({"prompt": "p", "size": "0x64"}, 422, "must be positive"),
    ({"prompt": "p", "seconds": 0}, 422, "'seconds' must be positive"),
    ({"prompt": "p", "seconds": "-1"}, 422, "'seconds' must be positive"),
    ({"prompt": "p", "seconds": 2.5}, 422, "this server allows at most 2 s"),
    ({"prompt": "p", "seconds": "soon"}, 422, "'seconds' must be a number"),
    ({"prompt": "p", "num_inference_steps": 1}, 422, "'num_inference_steps' must be at least 2"),
    ({"prompt": "p", "steps": "2.5"}, 422, "'steps' must be an integer"),
    ({"prompt": "p", "steps": 3, "num_inference_steps": 4}, 422, "disagree"),
    ({"prompt": "p", "num_inference_steps": 5000}, 422, "allows at most 1000"),
    ({"prompt": "p", "model": "sora-2"}, 422, "model 'sora-2' is not served here; this server serves 'MiniMax-H3'"),
    ({"prompt": "p", "fps": 30}, 422, "'fps' must be 24"),
    ({"prompt": "p", "guidance_scale": 5.0}, 422, "'guidance_scale' cannot be honoured"),
    ({"prompt": "p", "negative_prompt": "blurry"}, 422, "'negative_prompt' cannot be honoured"),
    ({"prompt": "p", "quality": "high"}, 422, "unknown field(s) 'quality'"),
    ({"prompt": "p", "input_reference": "x.png"}, 422, "'input_reference' must be a file part or a data URL"),
    ({"prompt": "p", "image": "x.png"}, 422, "send the first keyframe as 'input_reference'"),
    ({"prompt": "p", "size": "64x64", "resolution": 64}, 422, "not both"),
    ({"prompt": "p", "size": "64x64", "aspect_ratio": "1:1"}, 422, "applies only to a short-edge"),
    ({"prompt": "p", "resolution": 48}, 422, "multiple of 32"),
    ({"prompt": "p", "resolution": 32, "aspect_ratio": "2:1"}, 422, "unknown aspect ratio"),
    ({"prompt": "p", "num_frames": 30}, 422, "'num_frames' 30 is not a frame count this model makes"),
    ({"prompt": "p", "seed": -1}, 422, "'seed' must be between 0 and"),
    ({"prompt": "p", "seed": True}, 422, "'seed' must be a number"),
]


@pytest.fixture
def fake_client(tmp_path):
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path, max_seconds=2)) as client:
        yield client


@pytest.mark.parametrize("fields,status,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_refused_with_a_reason(fake_client, fields, status, message):
    for r in (fake_client.post("/v1/videos", json=fields), post_form(fake_client, fields)):
        assert r.status_code == status, (r.status_code, r.text)
        assert message in r.json()["detail"], r.json()


def test_unreadable_bodies_and_accepted_edge_values(fake_client, tmp_path):
    c = fake_client
    r = c.post("/v1/videos", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["detail"]
    r = c.post("/v1/videos", content=b"prompt", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "unsupported content type" in r.json()["detail"]
    r = c.post("/v1/videos", content=b"--x\r\n", headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400 and "malformed multipart" in r.json()["detail"]
    r = c.post("/v1/videos", json={"prompt": "p" * (2 << 20)})  # within the body limit (room for media)
    assert r.status_code == 422 and "'prompt' is 2097152 characters" in r.json()["detail"]
    limit = c.get("/v1/service/metadata").json()["limits"]["max_body_bytes"]
    r = c.post("/v1/videos", content=b" " * (limit + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert c.get("/v1/videos/video_nope").status_code == 404
    assert c.get("/v1/videos/video_nope/content").status_code == 404
    assert c.delete("/v1/videos/video_nope").status_code == 404
    # values that mean "no change" are accepted: guidance 1.0, an empty negative prompt, fps 24 as text,
    # a num_frames on the model's grid, an urlencoded form, the model name in another case
    ok = c.post(
        "/v1/videos",
        json={
            "prompt": "p",
            "guidance_scale": 1.0,
            "negative_prompt": "",
            "fps": "24",
            "num_frames": 22,
            "model": "minimax-h3",
            "seed": str(2**63 - 1),
        },
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["frames"] == 22 and ok.json()["seconds"] == f"{22 / 24:g}"
    form = c.post("/v1/videos", data={"prompt": "p", "size": "32x64", "seconds": "0.2"})
    assert form.status_code == 200 and form.json()["size"] == "32x64", form.text
    assert c.get(f"/v1/videos/{ok.json()['id']}/content").status_code in (200, 409)
    metrics = parse_metrics(c.get("/v1/service/metrics").text)
    assert metrics['telefuser_video_jobs_rejected_total{reason="invalid"}'] == 5  # 400, 415, 400, 422, 413 above


def test_models_health_metadata_and_metrics(fake_client):
    c = fake_client
    models = c.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "MiniMax-H3"
    meta = c.get("/v1/service/metadata").json()
    assert meta["limits"]["max_seconds"] == 2 and meta["limits"]["size_multiple"] == 32 and "prompt" in meta["fields"]
    vid = c.post("/v1/videos", json={"prompt": "p"}).json()["id"]
    done = poll(c, vid)
    wait_for(lambda: idle(c), what="idle")
    health = c.get("/v1/service/health").json()
    assert health["status"] == "ok" and health["jobs"]["completed"] == 1 and health["queue_depth"] == 0
    m = parse_metrics(c.get("/v1/service/metrics").text)
    assert m["telefuser_video_jobs_submitted_total"] == 1 and m["telefuser_video_jobs_completed_total"] == 1
    assert m["telefuser_video_inference_seconds_total"] == pytest.approx(done["inference_time_s"])
    assert m["telefuser_video_job_inference_seconds_count"] == 1 and m["telefuser_video_frames_generated_total"] == 22
    assert m['telefuser_video_jobs{status="completed"}'] == 1 and m["telefuser_video_queue_capacity"] == 16


def test_metadata_lists_the_models_the_cli_can_serve(tmp_path):
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path)) as client:
        assert client.get("/v1/service/metadata").json()["models"] == []
    app = create_video_app(FakeVideoRunner(), output_dir=tmp_path, models=("minimax_h3", "other"))
    with TestClient(app) as client:
        assert client.get("/v1/service/metadata").json()["models"] == ["minimax_h3", "other"]


# -- the command line ---------------------------------------------------------------------------------------------


def test_serve_fake_on_port_0_and_sigterm(tmp_path):
    command = [sys.executable, "-m", "telefuser.serving.video.cli", "serve", "--fake", "--port", "0", "--output-dir",
               str(tmp_path), "--fake-step-delay", "0.2", "--steps-default", "50"]  # fmt: skip
    with ServerProcess(command) as server:
        url = server.wait_url(30)
        server.wait_for_line("startup complete", 10)
        body, headers = aiohttp_form({"prompt": "a kite", "model": "MiniMax-H3", "size": "64x64", "seconds": 0.2})
        with httpx.Client(base_url=url, trust_env=False, timeout=10) as http:
            job = http.post("/v1/videos", content=body, headers=headers).json()
            wait_for(lambda: http.get(f"/v1/videos/{job['id']}").json()["progress"] > 0, 10, "progress")
        assert server.stop(signal.SIGTERM, 20) == 0, server.log
    assert "serve exited cleanly" in server.log, server.log
    record = json.loads((tmp_path / f"{job['id']}.json").read_text())
    assert record["status"] == "cancelled" and record["cancel_reason"] == "shutdown"


def test_warmup_runs_the_default_shape_then_another_on_every_rank(monkeypatch):
    """`--warmup on` (auto means on for CUDA): one request at the default size and seconds with steps=2, then one
    with a longer prompt and another frame count (torch.compile's second shape, where it turns dynamic), before
    serving, timed in the runner's metadata; off by default on the CPU."""
    from telefuser.pipelines.minimax_h3 import MiniMaxH3Pipeline
    from telefuser.serving.video.minimax import build_minimax_runner

    calls = []
    real_call = MiniMaxH3Pipeline.__call__

    def recording_call(self, prompt, **kwargs):
        calls.append({"prompt": prompt, **kwargs})
        return real_call(self, prompt, **kwargs)

    monkeypatch.setattr(MiniMaxH3Pipeline, "__call__", recording_call)
    args = tiny_runner_args(size_default="64x32", seconds_default=0.2, warmup="on")
    runner = build_minimax_runner(args)
    try:
        assert [(c["steps"], c["resolution"]) for c in calls] == [(2, "64x32")] * 2
        assert calls[0]["duration"] == 0.2  # 22 frames, the fewest; the second asks for the next grid point, 39
        assert calls[1]["duration"] * 24 == pytest.approx(39) and len(calls[1]["prompt"]) > len(calls[0]["prompt"])
        assert runner.metadata["warmup_s"] > 0
    finally:
        runner.close()
    args.warmup = "auto"  # on the CPU: no warm-up
    calls.clear()
    runner = build_minimax_runner(args)
    try:
        assert calls == [] and "warmup_s" not in runner.metadata
    finally:
        runner.close()


def test_a_finished_job_is_on_disk_before_a_reader_can_see_it_finished(tmp_path, monkeypatch):
    """While the worker writes a job's final record, a reader asking for that job waits: nobody sees "completed" that
    a restart would not find (before the fix the record was written after the lock was let go, and the reader's GET
    came back at once, "completed", with the file still saying in progress)."""
    import threading

    from telefuser.serving.video.jobs import RecordFiles

    save = RecordFiles.save
    seen: list[tuple[str, bool]] = []
    readers: list[threading.Thread] = []

    def watched_save(files, record):
        if record["status"] == "completed":
            reader = threading.Thread(target=client.get, args=(f"/v1/videos/{record['id']}",))
            reader.start()
            reader.join(0.5)  # a reader that got through now would have seen the ending before it was written
            seen.append((record["status"], reader.is_alive()))
            readers.append(reader)
        return save(files, record)

    monkeypatch.setattr(RecordFiles, "save", watched_save)
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path, max_seconds=2)) as client:
        r = client.post("/v1/videos", json={"prompt": "p", "seconds": 1})
        done = poll(client, r.json()["id"], timeout=30)
        assert done["status"] == "completed"
        for reader in readers:
            reader.join(5)
    assert seen == [("completed", True)]  # the reader was still waiting while the final record was written
    record = json.loads((tmp_path / f"{done['id']}.json").read_text())
    assert record["status"] == "completed" and record["result"] is not None
