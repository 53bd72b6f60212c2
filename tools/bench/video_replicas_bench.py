#!/usr/bin/env python3
"""Replicas of `telefuser serve --fake` sharing one PostgreSQL job store: how the job rate scales with 1, 2 and 4
replicas, and how long a job waits between its create and its claim by an idle replica (issue 26's targets: within
10% of linear; under 100 ms at p50).

    python -m tools.bench.video_replicas_bench                          # a private PostgreSQL cluster, 1/2/4
    python -m tools.bench.video_replicas_bench --database postgresql://... --replicas 1 2 4 8

Per replica count: a fresh database; the replicas start side by side (fake model, --fake-step-delay per step);
`--jobs-per-replica` x N jobs are created at once, then the rate is jobs / (last completion - first create); each
count runs `--repeats` times (the median and the best are shown: other work on a shared machine only slows a run).
`vs linear` is the median rate over N x the one-replica median rate. Then, on one idle replica, `--latency-samples` jobs one at a
time: create-to-claim is the job's `timings.queue_s` (created_at and started_at, both on the database's clock).
Without --database the private cluster comes from tools/harness/service_servers.py (Debian's postgresql must be installed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tools.harness.replica_processes import start_replicas, stop_all

JOB = {"prompt": "a lighthouse", "size": "64x32", "seconds": 0.2}  # 5 frames: muxing is small beside the steps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", default=None, help="a PostgreSQL server's URL (its databases are created here)")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--jobs-per-replica", type=int, default=20)
    p.add_argument("--steps", type=int, default=5, help="num_inference_steps per job (N-1 fake DiT calls)")
    p.add_argument("--step-delay", type=float, default=0.1, help="the fake model's seconds per DiT call")
    p.add_argument("--latency-samples", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def new_database(server_url: str) -> str:
    import uuid

    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def start(count: int, database: str, root: Path, args: argparse.Namespace):
    flags = ["--fake", "--job-store", database, "--artifacts", str(root / f"videos-{count}"), "--max-queue", "1000"]
    flags += ["--fake-step-delay", str(args.step_delay), "--steps-default", str(args.steps), "--poll-seconds", "1"]
    return start_replicas("serve", flags, [f"r{i}" for i in range(count)])


def throughput(replicas, jobs: int) -> float:
    clients = [httpx.Client(base_url=r.url, trust_env=False, timeout=30) for r in replicas]
    began = time.monotonic()
    for i in range(jobs):
        r = clients[i % len(clients)].post("/v1/videos", json={**JOB, "seed": i})
        r.raise_for_status()
    while clients[0].get("/v1/service/health").json()["jobs"]["completed"] < jobs:
        time.sleep(0.02)
    return jobs / (time.monotonic() - began)


def claim_latency(replica, samples: int) -> list[float]:
    client = httpx.Client(base_url=replica.url, trust_env=False, timeout=30)
    waits = []
    for i in range(samples):
        time.sleep(0.05)  # idle: the replica waits on LISTEN, not between polls
        vid = client.post("/v1/videos", json={**JOB, "seed": i, "num_inference_steps": 2}).json()["id"]
        while (job := client.get(f"/v1/videos/{vid}").json())["status"] != "completed":
            time.sleep(0.01)
        waits.append(job["timings"]["queue_s"])
    return waits


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = None
    if args.database is None:
        from tools.harness.service_servers import PostgresServer

        server = PostgresServer()
        args.database = server.url()
    rows, base = [], None
    try:
        with tempfile.TemporaryDirectory(prefix="telefuser-bench-") as tmp:
            for count in args.replicas:
                rates, latency = [], None
                for _ in range(args.repeats):
                    replicas = start(count, new_database(args.database), Path(tmp), args)
                    try:
                        rates.append(throughput(replicas, args.jobs_per_replica * count))
                        if count == 1 and latency is None:
                            latency = claim_latency(replicas[0], args.latency_samples)
                    finally:
                        stop_all(replicas)
                rate = statistics.median(rates)
                base = base or rate / count
                rows.append((count, args.jobs_per_replica * count, rate, max(rates), rate / (count * base), latency))
    finally:
        if server is not None:
            server.close()
    per_job = (args.steps - 1) * args.step_delay
    print(f"\nfake jobs of {args.steps - 1} DiT calls x {args.step_delay} s ({per_job:.2f} s of 'compute' each)")
    print(f"| replicas | jobs per run | jobs/s (median of {args.repeats}) | best | vs linear (median) |")
    print("| --- | --- | --- | --- | --- |")
    for count, jobs, rate, best, linear, _ in rows:
        print(f"| {count} | {jobs} | {rate:.2f} | {best:.2f} | {linear:.3f} |")
    latency = next((row[5] for row in rows if row[5] is not None), None)
    if latency:  # measured when a one-replica row ran
        cuts = statistics.quantiles(latency, n=20)
        print(
            f"\ncreate-to-claim on an idle replica ({len(latency)} jobs): p50 {statistics.median(latency) * 1000:.1f} "
            f"ms, p95 {cuts[18] * 1000:.1f} ms, max {max(latency) * 1000:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
