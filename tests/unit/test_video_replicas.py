"""Replicas of `telefuser serve --fake` sharing one PostgreSQL job store and one artifact store (issue 26's tests 1-6,
and the S3 store against moto's standalone server).

Every server is real and started here: a private PostgreSQL cluster (tools/harness/service_servers.py), the replicas as
processes (tools/harness/replica_processes.py; some in-process where a test needs no process to die), moto's S3 server.
The fake runner's run log (--fake-run-log: a line per run start, end or cancel, with its pid and time) is how "each job
ran exactly once" and "nothing ran twice at once" are checked.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from telefuser.media import probe_media
from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.fake import FakeVideoRunner
from telefuser.serving.video.store import QueuePolicy
from telefuser.serving.video.store.directory import DirectoryArtifacts
from telefuser.serving.video.store.postgres import PostgresJobStore
from tools.harness.replica_processes import read_run_log, start_replicas, stop_all, wait_for
from tools.harness.server_process import REPO
from tools.harness.service_servers import HAProxy, free_port

FINAL = ("completed", "failed", "cancelled")


def clients(replicas) -> list[httpx.Client]:
    return [httpx.Client(base_url=r.url, trust_env=False, timeout=30) for r in replicas]


def final(client: httpx.Client, video_id: str, timeout_s: float = 30.0, statuses=FINAL) -> dict:
    def done():
        r = client.get(f"/v1/videos/{video_id}")
        if r.status_code == 503:  # the job database is not reachable (yet): a client retries after Retry-After
            return None
        job = r.json()
        return job if job["status"] in statuses else None

    return wait_for(done, timeout_s, f"{video_id} to reach {statuses}")


def running(client: httpx.Client, video_id: str, timeout_s: float = 20.0) -> dict:
    def started():
        job = client.get(f"/v1/videos/{video_id}").json()
        return job if job["status"] == "in_progress" and job["progress"] > 0 else None

    return wait_for(started, timeout_s, f"{video_id} to be running")


def runs_of(log: list[dict], prompt: str) -> list[dict]:
    return [event for event in log if event["prompt"] == prompt]


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/v1/service/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def fake_flags(database: str, artifacts: Path, run_log: Path, *extra: str) -> list[str]:
    return ["--fake", "--job-store", database, "--artifacts", str(artifacts), "--fake-run-log", str(run_log), *extra]


@pytest.fixture(scope="module")
def three_replicas(postgres_server, tmp_path_factory):
    """Replicas a, b, c of one service: one database, one shared artifacts directory, 20 ms steps."""
    root = tmp_path_factory.mktemp("three")
    flags = fake_flags(postgres_server.new_database(), root / "videos", root / "runs.jsonl")
    flags += ["--fake-step-delay", "0.02", "--max-queue", "200", "--poll-seconds", "0.5", "--lease-seconds", "10"]
    replicas = start_replicas("serve", flags, ["a", "b", "c"])
    replicas_root = root
    yield replicas, replicas_root
    stop_all(replicas)


# -- 1. any replica answers for any job ------------------------------------------------------------------------------
def test_created_on_a_polled_on_b_downloaded_from_c_and_listed_alike_everywhere(three_replicas):
    replicas, root = three_replicas
    a, b, c = clients(replicas)
    ids = [a.post("/v1/videos", json={"prompt": f"fox {i}", "seed": i}).json()["id"] for i in range(3)]
    for vid in ids:
        job = final(b, vid)
        assert job["status"] == "completed" and job["attempts"] == 1 and job["worker"] in ("a", "b", "c"), job
        assert job["url"].startswith(str(b.base_url)) and job["timings"]["queue_s"] >= 0
    content = c.get(f"/v1/videos/{ids[0]}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    assert content.content == a.get(f"/v1/videos/{ids[0]}/content").content
    clip = root / "downloaded.mp4"
    clip.write_bytes(content.content)
    info = probe_media(clip)
    assert (info.width, info.height, info.video_frames) == (64, 64, 22) and info.has_audio

    def page(client: httpx.Client, params: dict) -> dict:
        listing = client.get("/v1/videos", params=params).json()
        for video in listing["data"]:
            assert video.pop("url").startswith(str(client.base_url))  # each replica links to itself
        return listing

    for params in ({"limit": 2, "order": "asc"}, {"limit": 2, "order": "asc", "after": ids[0]}, {"limit": 1}):
        pages = [page(client, params) for client in (a, b, c)]
        assert pages[0] == pages[1] == pages[2], params
    first, after_first = (
        b.get("/v1/videos", params=p).json() for p in ({"limit": 2, "order": "asc"}, {"order": "asc", "after": ids[0]})
    )
    assert [v["id"] for v in first["data"]] == ids[:2] and first["has_more"] is True
    assert [v["id"] for v in after_first["data"]][:2] == ids[1:]
    assert [v["id"] for v in a.get("/v1/videos", params={"limit": 3}).json()["data"]] == ids[::-1]
    assert c.get("/v1/videos", params={"after": "video_" + "0" * 32}).status_code == 404

    deleted = b.delete(f"/v1/videos/{ids[2]}")
    assert deleted.json() == {"id": ids[2], "object": "video.deleted", "deleted": True}
    assert a.get(f"/v1/videos/{ids[2]}").status_code == 404 and c.get(f"/v1/videos/{ids[2]}/content").status_code == 404
    assert not (root / "videos" / f"{ids[2]}.mp4").exists() and (root / "videos" / f"{ids[0]}.mp4").is_file()
    assert {h["replica"] for h in (x.get("/v1/service/health").json() for x in (a, b, c))} == {"a", "b", "c"}


def test_the_shipped_haproxy_config_fronts_the_video_replicas(three_replicas):
    replicas, _ = three_replicas
    port = free_port()
    env = {"VIDEO_PROXY_BIND": f"127.0.0.1:{port}", "VIDEO_REPLICA_A": f"127.0.0.1:{replicas[0].port}"}
    env["VIDEO_REPLICA_B"] = f"127.0.0.1:{replicas[1].port}"
    proxy = HAProxy(REPO / "docker" / "haproxy" / "serve.cfg", env, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http:
            vid = http.post("/v1/videos", json={"prompt": "through the proxy"}).json()["id"]
            assert final(http, vid)["status"] == "completed"  # each poll may land on either replica
            assert http.get(f"/v1/videos/{vid}/content").headers["content-type"] == "video/mp4"
            assert {http.get("/v1/service/health").json()["replica"] for _ in range(4)} == {"a", "b"}
    finally:
        proxy.close()


# -- 3. a cancel on any replica reaches the runner within one step -------------------------------------------------
def test_delete_through_b_stops_the_job_running_on_another_replica_within_a_step(three_replicas):
    replicas, root = three_replicas
    by_name = dict(zip("abc", clients(replicas)))
    vid = by_name["a"].post("/v1/videos", json={"prompt": "long running", "num_inference_steps": 400}).json()["id"]
    owner = running(by_name["a"], vid)["worker"]
    other = next(client for name, client in by_name.items() if name != owner)
    asked = time.time()
    r = other.delete(f"/v1/videos/{vid}")
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["cancel_reason"] == "client"
    stopped = wait_for(
        lambda: (job := other.get(f"/v1/videos/{vid}").json())["cancelled_at_step"] is not None and job,
        10,
        "the runner to stop",
    )
    events = runs_of(read_run_log(root / "runs.jsonl"), "long running")
    assert [e["event"] for e in events] == ["start", "cancelled"], events
    delay = events[1]["t"] - asked
    print(f"\ncancel through another replica reached the runner after {delay * 1000:.0f} ms (steps of 20 ms)")
    assert delay < 1.0 and 0 < stopped["cancelled_at_step"] < 399, (delay, stopped)
    assert other.get(f"/v1/videos/{vid}/content").status_code == 409


# -- 4. many jobs on many replicas: each runs exactly once ----------------------------------------------------------
def test_three_replicas_times_fifty_jobs_each_run_exactly_once(three_replicas):
    replicas, root = three_replicas
    all_clients = clients(replicas)
    before = [metric(client, "telefuser_video_jobs_completed_total") for client in all_clients]

    def submit(index: int) -> list[str]:
        client = all_clients[index]
        return [
            client.post("/v1/videos", json={"prompt": f"bulk {index}-{i}", "seed": i}).json()["id"] for i in range(50)
        ]

    with ThreadPoolExecutor(3) as pool:
        ids = [vid for batch in pool.map(submit, range(3)) for vid in batch]
    assert len(set(ids)) == 150
    jobs = [final(all_clients[i % 3], vid, timeout_s=120) for i, vid in enumerate(ids)]
    assert all(job["status"] == "completed" and job["attempts"] == 1 for job in jobs)
    log = read_run_log(root / "runs.jsonl")
    for index in range(3):
        for i in range(50):
            assert [e["event"] for e in runs_of(log, f"bulk {index}-{i}")] == ["start", "end"], (index, i)
    ran = [metric(client, "telefuser_video_jobs_completed_total") - b for client, b in zip(all_clients, before)]
    by_worker = {name: sum(job["worker"] == name for job in jobs) for name in "abc"}
    print(f"\n150 jobs: completed per replica {ran}, by worker field {by_worker}")
    assert sum(ran) == 150 and list(by_worker.values()) == ran and all(n > 0 for n in ran)
    assert all(metric(client, "telefuser_video_queue_depth") == 0 for client in all_clients)


# -- 2. a replica killed mid-denoise --------------------------------------------------------------------------------
def test_a_replica_killed_mid_job_loses_nothing_and_nothing_runs_twice_at_once(postgres_server, tmp_path):
    log_path = tmp_path / "runs.jsonl"
    flags = fake_flags(postgres_server.new_database(), tmp_path / "videos", log_path)
    flags += ["--fake-step-delay", "0.1", "--lease-seconds", "1.5", "--poll-seconds", "0.2"]
    replicas = start_replicas("serve", flags, ["a", "b"])
    replicas += start_replicas("serve", [*flags, "--max-attempts", "1"], ["c"])
    by_name = {r.name: r for r in replicas}
    try:
        # --max-attempts 1 (the row keeps the submitting replica's setting): the lost job fails as worker_lost
        c = clients([by_name["c"]])[0]
        once = c.post("/v1/videos", json={"prompt": "one attempt", "num_inference_steps": 30}).json()["id"]
        victim = by_name[running(c, once)["worker"]]
        victim.kill()
        survivors = [r for r in replicas if r is not victim]
        lost = final(clients(survivors)[0], once, timeout_s=20)
        assert lost["status"] == "failed" and lost["error"]["code"] == "worker_lost" and lost["attempts"] == 1, lost
        assert "stopped renewing its lease" in lost["error"]["message"]
        assert [e["event"] for e in runs_of(read_run_log(log_path), "one attempt")] == ["start"]

        # the default 3 attempts: another replica completes it
        submitter = next(r for r in survivors if r.name in "ab")
        client = clients([submitter])[0]
        vid = client.post("/v1/videos", json={"prompt": "two attempts", "num_inference_steps": 30}).json()["id"]
        victim = by_name[running(client, vid)["worker"]]
        killed_at = time.time()
        victim.kill()
        last = next(r for r in survivors if r is not victim)
        done = final(clients([last])[0], vid, timeout_s=30)
        assert done["status"] == "completed" and done["attempts"] == 2 and done["worker"] == last.name, done
        events = runs_of(read_run_log(log_path), "two attempts")
        assert [e["event"] for e in events] == ["start", "start", "end"], events
        assert events[0]["pid"] != events[1]["pid"] == events[2]["pid"]
        assert events[1]["t"] > killed_at  # the second run began only after the first replica was dead
    finally:
        stop_all(replicas)


# -- 5. the queue limit is global ------------------------------------------------------------------------------------
def test_the_global_max_queue_answers_429_on_every_replica(job_database, tmp_path):
    apps = [
        create_video_app(
            FakeVideoRunner(step_delay_s=0.05),
            job_store=PostgresJobStore(job_database, QueuePolicy(max_queue=3, poll_s=0.2)),
            artifacts=DirectoryArtifacts(tmp_path),
            worker_id=name,
        )
        for name in "abc"
    ]
    with TestClient(apps[0]) as a, TestClient(apps[1]) as b, TestClient(apps[2]) as c:
        busy = [
            x.post("/v1/videos", json={"prompt": f"busy {i}", "steps": 200}).json()["id"]
            for i, x in enumerate((a, b, c))
        ]
        wait_for(lambda: a.get("/v1/service/health").json()["jobs"]["in_progress"] == 3, 10, "three running jobs")
        queued = [x.post("/v1/videos", json={"prompt": "waits"}).json()["id"] for x in (a, b, c)]
        for client in (a, b, c):
            r = client.post("/v1/videos", json={"prompt": "one too many"})
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
            assert "3 job(s) waiting on all replicas (max_queue=3)" in r.json()["detail"]
            health = client.get("/v1/service/health").json()
            assert health["queue_depth"] == 3 and health["running"] in busy
        assert a.delete(f"/v1/videos/{queued[0]}").json()["status"] == "cancelled"
        assert c.post("/v1/videos", json={"prompt": "room again"}).status_code == 200
        for vid in busy + queued[1:]:
            a.delete(f"/v1/videos/{vid}")


def test_a_replica_shutting_down_hands_its_running_job_to_another(job_database, tmp_path):
    def replica(name: str):
        store = PostgresJobStore(job_database, QueuePolicy(poll_s=0.2))
        runner = FakeVideoRunner(step_delay_s=0.02)
        return create_video_app(runner, job_store=store, artifacts=DirectoryArtifacts(tmp_path), worker_id=name)

    with TestClient(replica("b")) as b:
        busy = b.post("/v1/videos", json={"prompt": "keeps b busy", "steps": 500}).json()["id"]
        running(b, busy)
        with TestClient(replica("a")) as a:
            vid = a.post("/v1/videos", json={"prompt": "handed over", "steps": 30}).json()["id"]
            assert running(a, vid)["worker"] == "a"
        # a stopped (SIGTERM runs this path): its job went back to the queue, not to "cancelled"
        assert b.get(f"/v1/videos/{vid}").json()["status"] == "queued"
        b.delete(f"/v1/videos/{busy}")  # b is free: it takes the job over
        job = final(b, vid)
        assert job["status"] == "completed" and job["worker"] == "b" and job["attempts"] == 1, job


# -- 6. the database goes away for a while ----------------------------------------------------------------------------
def test_a_database_outage_gives_503_with_retry_after_and_loses_no_job(postgres_server, tmp_path):
    log_path = tmp_path / "runs.jsonl"
    flags = fake_flags(postgres_server.new_database(), tmp_path / "videos", log_path)
    flags += ["--fake-step-delay", "0.05", "--lease-seconds", "8", "--poll-seconds", "0.3"]
    replicas = start_replicas("serve", flags, ["a", "b"])
    try:
        a, b = clients(replicas)
        ids = [
            (a, b)[i % 2].post("/v1/videos", json={"prompt": f"outage {i}", "steps": 20}).json()["id"] for i in range(6)
        ]
        wait_for(lambda: a.get("/v1/service/health").json()["jobs"]["in_progress"] == 2, 10, "two running jobs")
        postgres_server.stop()
        try:
            requests = [
                (client, method, path)
                for client in (a, b)
                for method, path in (
                    ("POST", "/v1/videos"),
                    ("GET", f"/v1/videos/{ids[-1]}"),
                    ("GET", "/v1/videos"),
                    ("DELETE", f"/v1/videos/{ids[-1]}"),
                    ("GET", "/v1/service/health"),
                    ("GET", "/v1/service/metrics"),
                )
            ]
            with ThreadPoolExecutor(len(requests)) as pool:
                answers = list(
                    pool.map(
                        lambda r: r[0].request(r[1], r[2], json={"prompt": "p"} if r[1] == "POST" else None), requests
                    )
                )
            time.sleep(1.0)  # the workers meet the outage too: renews and claims fail and back off
        finally:
            postgres_server.start()
        back = time.monotonic()
        for client in (a, b):
            wait_for(lambda c=client: c.get("/v1/service/health").status_code == 200, 30, "the replica to reconnect")
        print(f"\nreplicas answered again {time.monotonic() - back:.1f} s after the database was back")
        for (_, method, path), answer in zip(requests, answers):
            assert answer.status_code == 503 and int(answer.headers["Retry-After"]) >= 1, (method, path, answer.text)
            assert "database is unavailable" in answer.json()["detail"]
        jobs = [final(a, vid, timeout_s=60) for vid in ids]
        assert [job["status"] for job in jobs] == ["completed"] * 6 and all(job["attempts"] == 1 for job in jobs)
        log = read_run_log(log_path)
        for i in range(6):
            assert [e["event"] for e in runs_of(log, f"outage {i}")] == ["start", "end"], i
        assert b.post("/v1/videos", json={"prompt": "after"}).status_code == 200
    finally:
        stop_all(replicas)
    for replica in replicas:  # the outage was met with warnings and retries, never an unexpected error
        assert "Traceback" not in replica.log, replica.log[-3000:]


# -- artifacts in S3 (moto's standalone server), retention -------------------------------------------------------
@pytest.fixture
def s3_env(moto_s3, monkeypatch):
    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    return moto_s3


def test_s3_artifacts_stream_redirect_expire_and_delete_across_replicas(job_database, s3_env):
    import boto3

    from telefuser.serving.video.store.s3 import S3Artifacts

    bucket = s3_env.new_bucket()
    policy = QueuePolicy(lease_s=1.0, poll_s=0.2, retention_s=3.0)
    stream = S3Artifacts(f"s3://{bucket}/jobs", endpoint_url=s3_env.url)
    redirect = S3Artifacts(f"s3://{bucket}/jobs", endpoint_url=s3_env.url, redirect=True)
    s3 = boto3.client("s3", endpoint_url=s3_env.url)
    runner = FakeVideoRunner(step_delay_s=0.0)
    app_a = create_video_app(runner, job_store=PostgresJobStore(job_database, policy), artifacts=stream, worker_id="a")
    app_b = create_video_app(
        runner, job_store=PostgresJobStore(job_database, policy), artifacts=redirect, worker_id="b"
    )
    with TestClient(app_a) as a, TestClient(app_b, follow_redirects=False) as b:
        kept, gone = (a.post("/v1/videos", json={"prompt": p}).json()["id"] for p in ("kept", "gone"))
        done = final(b, kept)
        assert done["status"] == "completed" and done["expires_at"] == pytest.approx(time.time() + 3, abs=2)
        streamed = a.get(f"/v1/videos/{kept}/content")
        assert streamed.status_code == 200 and streamed.headers["content-type"] == "video/mp4"
        moved = b.get(f"/v1/videos/{kept}/content")
        assert moved.status_code == 307 and moved.headers["location"].startswith(
            f"{s3_env.url}/{bucket}/jobs/{kept}.mp4?"
        )
        assert httpx.get(moved.headers["location"], trust_env=False).content == streamed.content
        assert s3.head_object(Bucket=bucket, Key=f"jobs/{kept}.mp4")["ContentLength"] == len(streamed.content)

        final(a, gone)
        assert b.delete(f"/v1/videos/{gone}").json()["deleted"] is True
        with pytest.raises(s3.exceptions.ClientError):
            s3.head_object(Bucket=bucket, Key=f"jobs/{gone}.mp4")

        # past its retention a job reads as deleted at once, and the sweep removes its row and its object
        wait_for(lambda: a.get(f"/v1/videos/{kept}").status_code == 404, 10, "the job to expire")
        assert b.get(f"/v1/videos/{kept}/content").status_code == 404
        wait_for(lambda: "Contents" not in s3.list_objects_v2(Bucket=bucket), 10, "the sweep to delete the object")


def test_retention_expires_jobs_in_the_embedded_store_too(tmp_path):
    from telefuser.serving.video.store import open_embedded

    store, files = open_embedded(tmp_path, QueuePolicy(retention_s=1.0, lease_s=0.5))
    app = create_video_app(FakeVideoRunner(step_delay_s=0.0), job_store=store, artifacts=files)
    with TestClient(app) as client:
        vid = client.post("/v1/videos", json={"prompt": "short lived"}).json()["id"]
        job = final(client, vid)
        assert job["expires_at"] is not None and (tmp_path / f"{vid}.mp4").is_file()
        wait_for(lambda: client.get(f"/v1/videos/{vid}").status_code == 404, 10, "expiry")
        wait_for(lambda: not (tmp_path / f"{vid}.mp4").exists(), 10, "the sweep")
        assert not (tmp_path / f"{vid}.json").exists()


def test_flags_are_checked_before_the_model_loads(tmp_path):
    import subprocess
    import sys

    for args, message in (
        (["--job-store", "mysql://x"], "--job-store must be 'embedded' or a postgresql:// URL"),
        (["--max-attempts", "0"], "argument --max-attempts: must be 1 or more, got 0"),
        (["--s3-endpoint", "http://127.0.0.1:1"], "--s3-endpoint needs --artifacts s3://"),
        (["--replica-id", "a/b"], "is not a replica id"),
        (["--job-store", "postgresql://nobody@127.0.0.1:1/none"], "cannot reach the job database"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "telefuser.cli", "serve", "--fake", "--artifacts", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode != 0 and message in done.stderr, (args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, done.stderr[-2000:]
