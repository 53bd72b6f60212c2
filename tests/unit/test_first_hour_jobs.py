"""Issue 36: a job says which stage it is in (`stage`: "muxing" while the MP4 is written, with progress at 99), on
both job stores; the log has one line when a job starts and one when it ends, with the request's shape and the
seconds of each stage, for a completed, a failed and a cancelled job."""

from __future__ import annotations

import logging
import re
import threading

import pytest
from fastapi.testclient import TestClient

from telefuser.serving.video import fake as fake_module
from telefuser.serving.video.contract import RUN_STAGES
from telefuser.serving.video.fake import FakeVideoRunner
from tests.video_stores import STORE_KINDS, store_site
from tools.harness.replica_processes import wait_for

TINY = {"prompt": "a red fox in snow", "size": "64x32", "seconds": "0.2", "num_inference_steps": "4", "seed": "7"}


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_the_job_object_says_muxing_while_the_mp4_is_written(tmp_path, monkeypatch, request, kind):
    release = threading.Event()
    real_write = fake_module.write_clip

    def held_write(*args, **kwargs):  # the mux waits until the test has seen it
        assert release.wait(20), "the test never released the mux"
        return real_write(*args, **kwargs)

    monkeypatch.setattr(fake_module, "write_clip", held_write)
    runner = FakeVideoRunner(model="fake-MiniMax-H3", step_delay_s=0.02)
    with TestClient(store_site(kind, tmp_path, request).app(runner)) as client:
        job = client.post("/v1/videos", json=TINY).json()
        assert job["stage"] == "queued" and job["status"] == "queued"
        seen: list[str] = []

        def muxing():
            obj = client.get(f"/v1/videos/{job['id']}").json()
            if not seen or seen[-1] != obj["stage"]:
                seen.append(obj["stage"])
            return obj if obj["stage"] == "muxing" else None

        obj = wait_for(muxing, 20, "the muxing stage")
        assert obj["status"] == "in_progress" and obj["progress"] == 99, obj
        release.set()
        done = wait_for(
            lambda: (o := client.get(f"/v1/videos/{job['id']}").json())["status"] == "completed" and o, 20, "completion"
        )
        assert done["stage"] == "completed" and done["progress"] == 100
    order = ("queued", *RUN_STAGES)
    assert all(stage in order for stage in seen) and seen == sorted(seen, key=order.index), seen


def test_one_log_line_per_job_start_and_end_with_its_shape_and_stage_timings(tmp_path, caplog):
    runner = FakeVideoRunner(model="fake-MiniMax-H3", step_delay_s=0.01)
    site = store_site("embedded", tmp_path, None)
    with caplog.at_level(logging.INFO, logger="telefuser.serving"), TestClient(site.app(runner)) as client:
        job = client.post("/v1/videos", json=TINY).json()
        wait_for(lambda: client.get(f"/v1/videos/{job['id']}").json()["status"] == "completed", 20, "completion")
    lines = [r.getMessage() for r in caplog.records if job["id"] in r.getMessage()]
    started = [line for line in lines if " started " in line]
    ended = [line for line in lines if " completed in " in line]
    assert len(started) == 1 and len(ended) == 1, lines
    shape = "t2va 64x32, 22 frames (0.92 s at 24 fps), 4 steps (3 DiT calls), seed 7, prompt of 17 characters"
    assert started[0].startswith(f"video job {job['id']} started (attempt 1, ") and started[0].endswith(shape)
    timings = re.search(r"completed in [\d.]+ s \((.*?) s; pipeline: (.*?) s\)", ended[0])
    assert timings, ended[0]
    stages = [part.split()[0] for part in timings.group(1).split(", ")]
    assert stages == ["starting", "denoising", "decoding", "muxing", "publishing"], ended[0]
    assert "pipeline 0." in timings.group(2) and ended[0].endswith(shape), ended[0]


class _Exploding(FakeVideoRunner):
    def run(self, job_request, output, hooks):
        hooks.cancelled()
        hooks.progress(1, 3)
        raise RuntimeError("the model exploded")


def test_a_failed_and_a_cancelled_job_log_how_they_ended(tmp_path, caplog):
    site = store_site("embedded", tmp_path, None)
    with caplog.at_level(logging.INFO, logger="telefuser.serving"):
        with TestClient(site.app(_Exploding(step_delay_s=0.0))) as client:
            failed = client.post("/v1/videos", json=TINY).json()
            wait_for(lambda: client.get(f"/v1/videos/{failed['id']}").json()["status"] == "failed", 20, "failure")
        with TestClient(store_site("embedded", tmp_path / "two", None).app(FakeVideoRunner(step_delay_s=0.2))) as c:
            running = c.post("/v1/videos", json={**TINY, "num_inference_steps": "50"}).json()
            wait_for(lambda: c.get(f"/v1/videos/{running['id']}").json()["progress"] > 0, 20, "progress")
            c.delete(f"/v1/videos/{running['id']}")
            wait_for(lambda: c.get(f"/v1/videos/{running['id']}").json()["status"] == "cancelled", 20, "cancel")
            wait_for(lambda: any(" cancelled after " in r.getMessage() for r in caplog.records), 20, "the log")
    messages = [r.getMessage() for r in caplog.records]
    failure = [m for m in messages if m.startswith(f"video job {failed['id']} failed ")]
    assert len(failure) == 1, messages
    assert (
        "failed (generation_failed) after " in failure[0]
        and " in denoising: RuntimeError: the model exploded" in (failure[0])
    ), failure[0]
    assert failure[0].endswith("seed 7, prompt of 17 characters"), failure[0]
    cancelled = [m for m in messages if m.startswith(f"video job {running['id']} cancelled after ")]
    assert len(cancelled) == 1 and re.search(r"\d+ of 49 DiT calls done", cancelled[0]), cancelled
