"""Job records written before `spec` was renamed `job_request` (record schema telefuser.video_job/1) still load, in
both job stores: the embedded store's `<id>.json` files and the PostgreSQL store's `body` column, which is never
rewritten. New records are telefuser.video_job/2 and name the field `job_request` only.
"""

from __future__ import annotations

import json
import time

import psycopg
from fastapi.testclient import TestClient
from psycopg.types.json import Json

from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.contract import JobRequest, RunOutcome
from telefuser.serving.video.fake import FakeVideoRunner
from telefuser.serving.video.jobs import SCHEMA, RecordFiles, VideoJob, new_job_id
from telefuser.serving.video.store import QueuePolicy
from telefuser.serving.video.store.directory import DirectoryArtifacts
from telefuser.serving.video.store.postgres import PostgresJobStore, _job
from tools.harness.replica_processes import wait_for

# What a /1 server recorded as `spec`: only the fields JobRequest had then (docs/perf/2026-12-01's records)
OLD_SPEC = {"prompt": "a lighthouse at dusk", "resolution": "64x64", "aspect_ratio": "16:9", "seconds": 0.2,
            "steps": 4, "seed": 11, "output_size": None}  # fmt: skip
PLAN = json.loads(json.dumps(FakeVideoRunner().plan(JobRequest.from_dict(OLD_SPEC)).as_dict()))  # as stored


def old_record(status: str, **extra) -> dict:
    """A record as a telefuser.video_job/1 server wrote it to `<id>.json`."""
    return {
        "schema": "telefuser.video_job/1",
        "id": new_job_id(),
        "model": "MiniMax-H3",
        "prompt": OLD_SPEC["prompt"],
        "request": {"prompt": OLD_SPEC["prompt"], "size": "64x64", "seconds": 0.2, "steps": 4, "seed": 11},
        "spec": dict(OLD_SPEC),
        "plan": dict(PLAN),
        "created_at": time.time() - 60,
        "status": status,
        "revision": 3,
        **extra,
    }


def test_a_job_loads_from_a_record_of_either_schema_and_records_itself_in_the_current_one():
    old = old_record("queued")
    job = VideoJob.from_record(old)
    assert job.job_request == OLD_SPEC and job.plan == PLAN and job.revision == 3
    record = job.record()
    assert record["schema"] == SCHEMA == "telefuser.video_job/2"
    assert record["job_request"] == OLD_SPEC and "spec" not in record
    assert VideoJob.from_record(record) == job  # a /2 record reads back as the job it was written from
    # the video object (what clients see over HTTP) is the same whichever schema the record had
    assert job.to_object() == VideoJob.from_record({**record, "schema": "telefuser.video_job/1"}).to_object()
    shown = job.to_object()
    assert (shown["seconds"], shown["num_inference_steps"], shown["seed"], shown["task"]) == ("0.2", 4, 11, "t2va")
    assert "spec" not in shown and "job_request" not in shown


def test_the_embedded_store_serves_the_jobs_of_schema_1_records_after_an_upgrade(tmp_path):
    """Upgrading a server over its --artifacts directory keeps every job: a finished /1 job is listed, described and
    downloaded as before; an unfinished one becomes server_restarted, rewritten as /2 with what it was asked to do."""
    result = RunOutcome(0.5, 1000, "fake", PLAN["frames"], PLAN["fps"], 64, 64, PLAN["duration_s"], PLAN["dit_calls"])
    finished_at = time.time() - 30
    done = old_record("completed", progress=100, started_at=finished_at - 1, finished_at=finished_at,
                      result=result.as_dict())  # fmt: skip
    done["video_file"] = f"{done['id']}.mp4"
    interrupted = old_record("in_progress", started_at=finished_at)
    for record in (done, interrupted):
        (tmp_path / f"{record['id']}.json").write_text(json.dumps(record, indent=2))
    (tmp_path / f"{done['id']}.mp4").write_bytes(b"an mp4 from before the upgrade")

    jobs = {job.id: job for job in RecordFiles(tmp_path).load()}
    assert jobs[done["id"]].job_request == OLD_SPEC and jobs[interrupted["id"]].job_request == OLD_SPEC
    rewritten = json.loads((tmp_path / f"{interrupted['id']}.json").read_text())
    assert rewritten["schema"] == SCHEMA and rewritten["job_request"] == OLD_SPEC and "spec" not in rewritten
    assert rewritten["status"] == "failed" and rewritten["error"]["code"] == "server_restarted"
    assert json.loads((tmp_path / f"{done['id']}.json").read_text()) == done  # a finished record is not rewritten

    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path)) as client:
        listed = {v["id"]: v for v in client.get("/v1/videos").json()["data"]}
        assert set(listed) == {done["id"], interrupted["id"]}
        shown = client.get(f"/v1/videos/{done['id']}").json()
        assert shown["status"] == "completed" and shown == listed[done["id"]] | {"url": shown["url"]}
        assert (shown["prompt"], shown["seconds"], shown["num_inference_steps"], shown["seed"]) == (
            OLD_SPEC["prompt"], "0.2", 4, 11
        )  # fmt: skip
        assert client.get(f"/v1/videos/{done['id']}/content").content == b"an mp4 from before the upgrade"
        assert client.get(f"/v1/videos/{interrupted['id']}").json()["status"] == "failed"


def _row(body: dict) -> dict:
    """A `video_jobs` row as the PostgreSQL store reads it (postgres.COLUMNS)."""
    return {"id": new_job_id(), "status": "queued", "body": body, "created_at": 1.0, "progress": 0,
            "cancel_requested": False, "attempts": 0, "revision": 1}  # fmt: skip


def test_a_postgres_body_of_either_name_reads_as_the_same_job():
    fixed = {"model": "MiniMax-H3", "prompt": OLD_SPEC["prompt"], "request": {}, "plan": PLAN}
    old, new = _row({**fixed, "spec": OLD_SPEC}), _row({**fixed, "job_request": OLD_SPEC})
    assert _job(old).job_request == _job(new).job_request == OLD_SPEC
    assert _job(old).to_object() == _job(new | {"id": old["id"]}).to_object()


def test_a_job_an_old_replica_queued_in_postgres_runs_on_an_upgraded_one(job_database, tmp_path):
    """A row whose body names the job request `spec` (inserted as a /1 replica's submit did) is described, claimed
    and run with what it asked for; its body is left as it was written."""
    store = PostgresJobStore(job_database, QueuePolicy(poll_s=0.1))  # creates the table
    body = {"model": "MiniMax-H3", "prompt": OLD_SPEC["prompt"], "request": {"prompt": OLD_SPEC["prompt"]},
            "spec": OLD_SPEC, "plan": PLAN}  # fmt: skip
    job_id = new_job_id()
    with psycopg.connect(job_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO video_jobs (id, status, body, created_at, max_attempts, revision) "
            "VALUES (%s, 'queued', %s, extract(epoch FROM clock_timestamp()), 3, 1)",
            (job_id, Json(body)),
        )
    runner = FakeVideoRunner(step_delay_s=0.0)
    app = create_video_app(runner, job_store=store, artifacts=DirectoryArtifacts(tmp_path), worker_id="new")
    with TestClient(app) as client:
        done = wait_for(
            lambda: (job := client.get(f"/v1/videos/{job_id}").json())["status"] in ("completed", "failed") and job,
            20,
            f"{job_id} to finish",
        )
        assert done["status"] == "completed", done
        assert (done["seconds"], done["num_inference_steps"], done["seed"]) == ("0.2", 4, 11)
        assert client.get(f"/v1/videos/{job_id}/content").status_code == 200
    assert runner.calls == [JobRequest.from_dict(OLD_SPEC).as_dict()]
    with psycopg.connect(job_database) as conn:
        (stored,) = conn.execute("SELECT body FROM video_jobs WHERE id = %s", (job_id,)).fetchone()
    assert stored == body
