#!/usr/bin/env python3
r"""Batch benchmark: `telefuser serve` (/v1/videos) + AIPerf's built-in video_generation endpoint + video checks.

Run it with the ENGINE's Python (it starts the service and probes the MP4s with PyAV); AIPerf runs from .venv-aiperf:

    .venv/bin/python -m tools.aiperf.run_batch_bench                                    # 4 jobs, tiny, CPU
    .venv/bin/python -m tools.aiperf.run_batch_bench --bench-config tools/aiperf/configs/batch_minimax_h3_ci.yaml
    python -m tools.aiperf.run_batch_bench --config official --checkpoint /models/MiniMax-H3 --nproc 4 \
        --service-arg=--ulysses-degree=2 --service-arg=--tp-degree=2

Steps: start the service (own process group) -> wait for /v1/service/health -> scrape /v1/service/metrics ->
`aiperf profile --config <bench config>` -> scrape again -> re-download every job's MP4 from the raw export's job ids
and probe it with PyAV (video frames == the job's frame count, an audio stream) -> stop the service (SIGINT, wait) ->
print latency / inference time / peak memory -> write <artifact dir>/telefuser_summary.json. Exit status 0 only when
AIPerf succeeded, no request failed, completed == planned and every video passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tools.aiperf.telefuser_aiperf.artifacts import aiperf_metrics, check_completeness, load_profile, load_raw_records
from tools.aiperf.telefuser_aiperf.batch import (
    VIDEO_TAGS,
    check_video,
    jobs_from_raw,
    probe_video,
    video_service_deltas,
)
from tools.aiperf.telefuser_aiperf.runner import (
    REPO_ROOT,
    add_launch_options,
    bench_parser,
    free_port,
    http_get,
    load_bench_config,
    model_flags,
    planned_requests,
    prepare_artifact_dir,
    run_aiperf,
    scrape_metrics,
    service_command,
    start_service,
    write_json,
)
from tools.aiperf.telefuser_aiperf.summary import distribution

DEFAULT_CONFIG = REPO_ROOT / "tools/aiperf/configs/batch_minimax_h3.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p, m = bench_parser(
        __doc__, DEFAULT_CONFIG, "telefuser serve", "MiniMax-H3 checkpoint (random weights when omitted)"
    )
    m.add_argument("--size", default=None, help="video size when a request omits it (service --size-default)")
    m.add_argument("--seconds", type=float, default=None, help="seconds when a request omits it")
    m.add_argument("--steps", type=int, default=None, help="num_inference_steps when a request omits it")
    m.add_argument("--fake", action="store_true", help="the model-free test runner (pattern + tone)")
    m.add_argument("--fake-step-delay", type=float, default=0.01)
    m.add_argument(
        "--service-arg", action="append", default=[], help="extra service flag, e.g. --service-arg=--tp-degree=2"
    )
    m.add_argument(
        "--service-module",
        default=None,
        help="module whose CLI has `serve` (default: telefuser.cli, else telefuser.serving.video.cli)",
    )
    m.add_argument(
        "--output-dir", type=Path, default=None, help="service --output-dir (default: <artifact dir>/service_videos)"
    )
    add_launch_options(p, m)
    return p.parse_args(argv)


def serve_module(python: str, override: str | None) -> str:
    if override:
        return override
    probe = subprocess.run(
        [python, "-m", "telefuser.cli", "serve", "--help"], cwd=REPO_ROOT, capture_output=True, check=False
    )
    return "telefuser.cli" if probe.returncode == 0 else "telefuser.serving.video.cli"


def service_args(args: argparse.Namespace, port: int, output_dir: Path) -> list[str]:
    out = ["--host", "127.0.0.1", "--port", str(port), "--output-dir", str(output_dir), "--log-level", "info"]
    out += model_flags(
        args,
        ["--fake", "--fake-step-delay", str(args.fake_step_delay)],
        {
            "--checkpoint": args.checkpoint,
            "--device": args.device,
            "--dtype": args.dtype,
            "--size-default": args.size,
            "--seconds-default": args.seconds,
            "--steps-default": args.steps,
        },
    )
    return out + list(args.service_arg)


def scrape(url: str) -> dict:
    """The metrics, or none when the service does not serve them (the checks then say what is missing)."""
    try:
        return scrape_metrics(url)
    except RuntimeError:
        return {}


def wait_idle(url: str, timeout_s: float = 60.0) -> None:
    """Until the service runs no job: a worker counts a job's end in its metrics just after recording it, so a client
    that saw the last job complete can scrape a moment too early."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = http_get(f"{url}/v1/service/health")
        if status == 200 and json.loads(body).get("running") is None:
            return
        time.sleep(0.05)


def check_jobs(url: str, artifact_dir: Path) -> tuple[list[dict], list[str]]:
    """Re-download every job's content and probe it."""
    problems: list[str] = []
    jobs = jobs_from_raw(load_raw_records(artifact_dir))
    video_dir = artifact_dir / "videos"
    video_dir.mkdir(exist_ok=True)
    for job in jobs:
        tag = f"request {job['request']} ({job['phase']}, job {job['id']})"
        final = job["final"] or {}
        if job["error"]:
            problems.append(f"{tag}: AIPerf recorded an error: {job['error']}")
        if final.get("status") != "completed":
            problems.append(f"{tag}: final status {final.get('status')!r}")
            continue
        status, body = http_get(f"{url}/v1/videos/{job['id']}/content", timeout=300)
        if status != 200:
            problems.append(f"{tag}: GET content answered {status}")
            continue
        path = video_dir / f"{job['id']}.mp4"
        path.write_bytes(body)
        try:
            job["video"] = probe_video(path)
        except Exception as exc:  # a file PyAV cannot open is a failed video
            problems.append(f"{tag}: PyAV could not read {path}: {exc}")
            continue
        problems += [f"{tag}: {p}" for p in check_video(job["video"], final)]
    return jobs, problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config_path = args.bench_config.resolve()
    config = load_bench_config(config_path)
    planned = planned_requests(config)
    artifact_dir = prepare_artifact_dir(
        (args.artifact_dir or REPO_ROOT / "outputs/aiperf" / config_path.stem).resolve()
    )
    summary_path = args.summary or artifact_dir / "telefuser_summary.json"
    run: dict = {
        "bench_config": str(config_path),
        "model_config": "fake" if args.fake else args.config,
        "checkpoint": args.checkpoint,
        "nproc": args.nproc,
        "device": args.device,
    }
    problems: list[str] = []
    jobs: list[dict] = []
    deltas = None
    service = None
    started = time.monotonic()
    try:
        if args.service_url:
            url = args.service_url.rstrip("/")
        else:
            port = args.port or free_port()
            url = f"http://127.0.0.1:{port}"
            output_dir = (args.output_dir or artifact_dir / "service_videos").resolve()
            module = serve_module(args.python, args.service_module)
            cmd = service_command(args.python, "serve", args.nproc, service_args(args, port, output_dir))
            if module != "telefuser.cli":
                cmd[cmd.index("telefuser.cli")] = module
            service = start_service(args, cmd, artifact_dir, url, run)
        before = scrape(url)
        rc, aiperf_s = run_aiperf(
            args.aiperf, config_path, artifact_dir, url, tokenizer=args.tokenizer, timeout_s=args.aiperf_timeout
        )
        run["aiperf_rc"], run["aiperf_wall_s"] = rc, round(aiperf_s, 3)
        if rc != 0:
            problems.append(f"aiperf exited with {rc} (see {artifact_dir / 'aiperf_console.log'})")
        wait_idle(url)
        deltas = video_service_deltas(before, scrape(url))
        jobs, job_problems = check_jobs(url, artifact_dir)
        problems += job_problems
    except Exception as exc:
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        if service is not None:
            run["service_exit"] = service.stop()
            if not service.stopped_cleanly(run["service_exit"], torchrun=args.nproc > 1):
                problems.append(f"the service exited with {run['service_exit']} (see {service.log_path})")
    run["wall_s"] = round(time.monotonic() - started, 3)

    summary: dict = {"kind": "batch", "artifact_dir": str(artifact_dir), "planned_requests": planned}
    problems = check_completeness(artifact_dir, planned) + problems
    if (artifact_dir / "profile_export_aiperf.json").exists():
        summary["aiperf"] = aiperf_metrics(load_profile(artifact_dir), VIDEO_TAGS)
    profiled = [j for j in jobs if j.get("phase") != "warmup"]
    if deltas is not None and deltas.get("jobs_failed_total"):
        problems.append(f"the service counted {deltas['jobs_failed_total']:g} failed job(s)")
    summary["jobs"] = jobs
    summary["headline"] = {
        "jobs_checked": len(jobs),
        "inference_time_s": distribution(
            [
                j["final"]["inference_time_s"]
                for j in profiled
                if (j.get("final") or {}).get("inference_time_s") is not None
            ]
        ),
        "peak_memory_mb": distribution(
            [j["final"]["peak_memory_mb"] for j in profiled if (j.get("final") or {}).get("peak_memory_mb") is not None]
        ),
        "request_latency_s": distribution(
            [
                (j["request_end_ns"] - j["request_start_ns"]) / 1e9
                for j in profiled
                if j.get("request_end_ns") and j.get("request_start_ns")
            ]
        ),
    }
    summary["service_metric_deltas"] = deltas
    summary["run"] = run
    summary["passed"] = not problems
    summary["problems"] = problems
    write_json(summary_path, summary)
    print_summary(summary, summary_path)
    return 0 if not problems else 1


def _dist(d: dict | None, unit: str) -> str:
    if not d:
        return "n/a"
    return f"p50 {d['p50']:.3f}{unit}  p90 {d['p90']:.3f}{unit}  max {d['max']:.3f}{unit}  (n={d['count']})"


def print_summary(summary: dict, path: Path) -> None:
    head, aiperf = summary["headline"], summary.get("aiperf") or {}
    print("\n== TeleFuser batch video benchmark")
    latency = aiperf.get("request_latency") or {}
    if latency:
        avg, p50, top = (latency.get(k, 0) / 1000 for k in ("avg", "p50", "max"))
        print(
            f"   request latency      avg {avg:.3f} s  p50 {p50:.3f} s  max {top:.3f} s"
            f"  (AIPerf: submit -> completed -> content downloaded)"
        )
    print(f"   inference time       {_dist(head['inference_time_s'], ' s')}  (server inference_time_s)")
    print(f"   peak memory          {_dist(head['peak_memory_mb'], ' MB')}  (server peak_memory_mb)")
    videos = [j.get("video") or {} for j in summary["jobs"]]
    if videos:
        print(
            f"   videos               {sum(1 for v in videos if v.get('frames'))}/{len(videos)} decoded, "
            f"{sum(1 for v in videos if v.get('audio_stream'))}/{len(videos)} with audio, frames "
            f"{sorted({v.get('frames') for v in videos if v})}"
        )
    run = summary["run"]
    print(f"   wall                 {run.get('wall_s')} s total, aiperf {run.get('aiperf_wall_s')} s")
    print(f"   checks               {'PASSED' if summary['passed'] else 'FAILED'}")
    for problem in summary["problems"]:
        print(f"     - {problem}")
    print(f"   summary              {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
