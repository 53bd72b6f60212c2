"""The service under test: started here (its own process group, lossless delivery) or attached at --url; its health,
metadata and Prometheus metrics; stopped at the end. The process and HTTP plumbing is the AIPerf runners'."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from typing import Any

from tools.aiperf.telefuser_aiperf.artifacts import sample_sum
from tools.aiperf.telefuser_aiperf.runner import (
    Service,
    free_port,
    http_get,
    model_flags,
    scrape_metrics,
    service_command,
    wait_healthy,
)
from tools.bench.stream_drive.plan import RunError
from tools.bench.stream_drive.progress import log

PREFIX = "telefuser_stream_"


def service_args(args: argparse.Namespace, port: int) -> list[str]:
    out = ["--host", "127.0.0.1", "--port", str(port), "--delivery-mode", "lossless", "--log-level", args.log_level]
    out += ["--max-sessions", str(args.max_sessions or args.concurrency)]
    optional = {
        "--checkpoint": args.checkpoint,
        "--device": args.device,
        "--dtype": args.dtype,
        "--quantization": args.quantization,
        "--vae-dtype": args.vae_dtype,
        "--attn-impl": args.attn_impl,
        "--warmup": args.warmup,
        "--resolution": args.resolution,
        "--buffer-chunks": args.buffer_chunks,
        "--jpeg-quality": args.jpeg_quality,
    }
    return out + model_flags(args, ["--fake", "--fake-delay", str(args.fake_delay)], optional) + args.passthrough


def start(args: argparse.Namespace) -> tuple[Service, str]:
    """Start serve-stream on a free loopback port (torchrun when --nproc > 1); (the service, its base URL)."""
    port = args.port or free_port()
    cmd = service_command(args.python, "serve-stream", args.nproc, service_args(args, port))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    log_path = args.service_log or args.output.parent / "service.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the table's
        return Service(cmd, log_path, env=env), f"http://127.0.0.1:{port}"


async def healthy(base: str, timeout_s: float, service: Service | None, headers: dict[str, str]) -> float:
    """Seconds until /v1/service/health answered ok; RunError names what did not happen."""
    try:
        return await asyncio.to_thread(
            wait_healthy, f"{base}/v1/service/health", timeout_s, service=service, headers=headers
        )
    except RuntimeError as exc:
        raise RunError(str(exc)) from exc


async def metadata(base: str, headers: dict[str, str]) -> dict[str, Any]:
    url = f"{base}/v1/service/metadata"
    try:
        status, body = await asyncio.to_thread(http_get, url, 30, headers)
        answer = json.loads(body) if status == 200 else None
    except (OSError, ValueError) as exc:
        raise RunError(f"GET {url} failed within 30 s: {type(exc).__name__}: {exc}") from exc
    if answer is None:
        raise RunError(f"GET {url} answered {status}: {body[:300]!r}")
    return answer


async def metrics(base: str, headers: dict[str, str]) -> dict:
    try:
        return await asyncio.to_thread(scrape_metrics, base, headers)
    except (OSError, RuntimeError) as exc:
        raise RunError(f"the service's metrics: {type(exc).__name__}: {exc}") from exc


def metric_phases(deltas: dict[str, float], before, after) -> dict[str, Any]:
    """What the Prometheus deltas say per chunk (server side)."""

    def delta(name: str) -> float:
        return sample_sum(after, PREFIX + name) - sample_sum(before, PREFIX + name)

    chunks = deltas["chunks_generated_total"]
    count, total = delta("chunk_compute_seconds_count"), delta("chunk_compute_seconds_sum")
    return {
        "chunk_compute_mean_s": round(total / count, 6) if count else None,
        "encode_per_chunk_s": round(delta("encode_seconds_total") / chunks, 6) if chunks else None,
        "backpressure_s": round(deltas["backpressure_seconds_total"], 6),
        "bytes_sent": delta("bytes_sent_total"),
        "client_messages_dropped": delta("client_messages_dropped_total"),
        "notices_dropped": delta("notices_dropped_total"),
    }


def stop(args: argparse.Namespace, summary: dict[str, Any], service: Service | None) -> None:
    if service is None:
        return
    log(f"stopping the service (SIGINT to its process group, {args.stop_timeout:g} s before SIGTERM)")
    with contextlib.redirect_stdout(sys.stderr):
        rc, problem = service.stop_and_check(args.stop_timeout, torchrun=args.nproc > 1)
    summary["service"]["exit_code"] = rc
    if problem:
        summary["problems"].append(problem)
