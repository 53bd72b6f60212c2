#!/usr/bin/env python3
r"""Stream benchmark: `telefuser serve-stream` + AIPerf (telefuser_stream plugin) + the lossless checks.

Run it with the ENGINE's Python (it starts the service with that interpreter); AIPerf runs from .venv-aiperf:

    .venv/bin/python -m tools.aiperf.run_stream_bench                                   # 1-min session, tiny, CPU
    .venv/bin/python -m tools.aiperf.run_stream_bench \
        --bench-config tools/aiperf/configs/stream_lingbot_world_v2_ci.yaml                 # the 3-chunk CI session
    python -m tools.aiperf.run_stream_bench --config official --checkpoint /models/lingbot-world-v2 \
        --nproc 4                                                                       # a GPU host (torchrun)

Steps: start the service (its own process group) -> wait for /v1/service/health -> scrape /v1/service/metrics ->
`aiperf profile --config <bench config>` -> scrape metrics again -> stop the service (SIGINT, wait) -> check the
artifacts (telefuser_aiperf.artifacts.check_stream_run) -> print the headline numbers -> write
<artifact dir>/telefuser_summary.json. Exit status 0 only when AIPerf succeeded and every lossless check passed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from tools.aiperf.telefuser_aiperf.artifacts import check_stream_run, stream_service_deltas
from tools.aiperf.telefuser_aiperf.runner import (
    REPO_ROOT,
    add_launch_options,
    bench_parser,
    endpoint_extra,
    free_port,
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

DEFAULT_CONFIG = REPO_ROOT / "tools/aiperf/configs/stream_lingbot_world_v2_1min.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p, m = bench_parser(
        __doc__, DEFAULT_CONFIG, "telefuser serve-stream", "checkpoint directory (random weights when omitted)"
    )
    LINGBOT_WORLD_V2.add_flags(m, only=("attn_impl",), attn_impl=None)  # None: the service's default
    m.add_argument("--resolution", default=None, help="the service's default resolution WxH")
    m.add_argument("--fake", action="store_true", help="the test-pattern model instead of LingBot-World v2")
    m.add_argument("--fake-delay", type=float, default=0.25, help="--fake: seconds per chunk")
    m.add_argument("--buffer-chunks", type=int, default=None)
    add_launch_options(p, m)
    return p.parse_args(argv)


def service_args(args: argparse.Namespace, port: int) -> list[str]:
    out = ["--host", "127.0.0.1", "--port", str(port), "--delivery-mode", "lossless", "--log-level", "info"]
    return out + model_flags(
        args,
        ["--fake", "--fake-delay", str(args.fake_delay)],
        {
            "--checkpoint": args.checkpoint,
            "--device": args.device,
            "--dtype": args.dtype,
            "--attn-impl": args.attn_impl,
            "--resolution": args.resolution,
            "--buffer-chunks": args.buffer_chunks,
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config_path = args.bench_config.resolve()
    config = load_bench_config(config_path)
    extra = endpoint_extra(config)
    expected_frames = int(extra["num_frames"])
    warmup_chunks = int(extra.get("warmup_chunks", 1))
    target_fps = float(extra.get("target_fps") or extra.get("fps") or 0) or None
    planned = planned_requests(config)
    artifact_dir = prepare_artifact_dir(
        (args.artifact_dir or REPO_ROOT / "outputs/aiperf" / config_path.stem).resolve()
    )
    summary_path = args.summary or artifact_dir / "telefuser_summary.json"

    started = time.monotonic()
    service = None
    run: dict = {
        "bench_config": str(config_path),
        "model_config": "fake" if args.fake else args.config,
        "checkpoint": args.checkpoint,
        "nproc": args.nproc,
        "device": args.device,
    }
    problems: list[str] = []
    deltas = None
    try:
        if args.service_url:
            url = args.service_url.rstrip("/")
        else:
            port = args.port or free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = service_command(args.python, "serve-stream", args.nproc, service_args(args, port))
            service = start_service(args, cmd, artifact_dir, url, run)
        before = scrape_metrics(url)
        rc, aiperf_s = run_aiperf(
            args.aiperf, config_path, artifact_dir, url, tokenizer=args.tokenizer, timeout_s=args.aiperf_timeout
        )
        run["aiperf_rc"], run["aiperf_wall_s"] = rc, round(aiperf_s, 3)
        if rc != 0:
            problems.append(f"aiperf exited with {rc} (see {artifact_dir / 'aiperf_console.log'})")
        deltas = stream_service_deltas(before, scrape_metrics(url))
    except Exception as exc:  # the service or AIPerf could not run: still write what we know
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        if service is not None:
            run["service_exit"], problem = service.stop_and_check(60.0, torchrun=args.nproc > 1)
            problems += [problem] if problem else []
    run["wall_s"] = round(time.monotonic() - started, 3)

    if any((artifact_dir / name).exists() for name in ("profile_export_aiperf.json", "profile_export.jsonl")):
        summary, check_problems = check_stream_run(
            artifact_dir,
            expected_frames=expected_frames,
            planned_requests=planned,
            warmup_chunks=warmup_chunks,
            target_fps=target_fps,
            service_deltas=deltas,
        )
        problems = problems + check_problems
    else:
        summary = {"kind": "stream", "artifact_dir": str(artifact_dir)}
        problems.append("AIPerf wrote no results (see aiperf_console.log)")
    summary["run"] = run
    summary["passed"] = not problems
    summary["problems"] = problems
    write_json(summary_path, summary)
    print_summary(summary, summary_path)
    return 0 if not problems else 1


def _fmt(value, unit: str = "", digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def print_summary(summary: dict, path: Path) -> None:
    head = summary.get("headline") or {}
    compute, interval = head.get("chunk_compute_s") or {}, head.get("chunk_interval_s") or {}
    aiperf = summary.get("aiperf") or {}
    icl = aiperf.get("inter_chunk_latency") or {}
    print("\n== TeleFuser stream benchmark")
    print(
        f"   steady compute FPS   {_fmt(head.get('steady_compute_fps'), digits=2)}  "
        f"(Σframes/Σcompute, chunks >= warm-up; target {(summary.get('sessions') or [{}])[0].get('target_fps')})"
    )
    print(f"   client FPS           {_fmt(head.get('client_fps'), digits=2)}  (frames after chunk 0 / arrival span)")
    print(f"   first-frame latency  {_fmt(head.get('first_frame_latency_s'), ' s')}")
    print(
        f"   chunk compute        p50 {_fmt(compute.get('p50'), ' s')}  p90 {_fmt(compute.get('p90'), ' s')}  "
        f"max {_fmt(compute.get('max'), ' s')}"
    )
    print(
        f"   chunk interval       p50 {_fmt(interval.get('p50'), ' s')}  p90 {_fmt(interval.get('p90'), ' s')}  "
        f"max {_fmt(interval.get('max'), ' s')}  (AIPerf inter_chunk_latency avg {_fmt(icl.get('avg'), ' ms', 1)})"
    )
    run = summary.get("run") or {}
    print(f"   wall                 {run.get('wall_s')} s total, aiperf {run.get('aiperf_wall_s')} s")
    verdict = "PASSED" if summary.get("passed") else "FAILED"
    print(f"   lossless checks      {verdict}")
    for problem in summary.get("problems") or []:
        print(f"     - {problem}")
    print(f"   summary              {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
