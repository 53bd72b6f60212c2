#!/usr/bin/env python3
"""Direct benchmark of `telefuser serve` (MiniMax H3): jobs one after another through the OpenAI SDK, each MP4
downloaded and probed, and how the first job after start-up compares with the later ones (the warm-up rule: the
first request within 1.3x of a steady one).

    python -m tools.bench.video_service_bench --config official --warmup on \\
        --jobs 1344x768:1 1344x768:1 1344x768:2 -- --seconds-default 1   # the GPU run: warm-up at the job's shape
    python -m tools.bench.video_service_bench --fake                    # CPU smoke run: the fake model
    python -m tools.bench.video_service_bench --url http://127.0.0.1:8000 --jobs 1344x768:1   # a running service

Steps: start `python -m telefuser.cli serve` (its own process group, a free loopback port, --output-dir under the
output folder), or use --url -> wait for /v1/service/health -> read /v1/service/metadata (the warm-up's seconds when it
ran) -> per job: `client.videos.create`, poll `client.videos.retrieve` until it is final, `download_content`, probe
the MP4 (size, frames, audio) -> stop the service (SIGINT, SIGTERM, SIGKILL) -> print the table, write the JSON.

Per job: the client's wall time (create -> completed seen), the service's inference seconds and, from the job's record
in the output folder (not with --url), the seconds of each DiT call. `first / steady` is the first job's inference
seconds over the median of the later jobs of the same size and seconds; `first DiT call / steady` the first job's
first DiT call over the median of every later DiT call at that shape. Exit status: 0 when every job completed and
its MP4 matched what the job said; 1 when a job failed, timed out or its file did not match; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from tools.aiperf.telefuser_aiperf.runner import (
    Service,
    format_value,
    free_port,
    http_get,
    service_command,
    split_passthrough,
    write_json,
)

REPO = Path(__file__).resolve().parents[2]
FINAL = ("completed", "failed", "cancelled")


def parse_job(text: str) -> tuple[str, float]:
    """``WIDTHxHEIGHT:SECONDS`` -> (size, seconds)."""
    size, sep, seconds = text.partition(":")
    try:
        width, height = (int(v) for v in size.lower().split("x"))
        value = float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a job is WIDTHxHEIGHT:SECONDS (e.g. 1344x768:1), got {text!r}") from None
    if not sep or width <= 0 or height <= 0 or value <= 0:
        raise argparse.ArgumentTypeError(f"a job is WIDTHxHEIGHT:SECONDS with positive numbers, got {text!r}")
    return f"{width}x{height}", value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv, passthrough = split_passthrough(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = p.add_mutually_exclusive_group()
    model.add_argument("--config", choices=["official", "tiny"], default=None, help="random weights of this size")
    model.add_argument("--fake", action="store_true", help="the service's fake model (no weights; CPU smoke runs)")
    model.add_argument("--url", default=None, help="a running service: nothing is started or stopped")
    p.add_argument("--device", default=None, help="the service's --device")
    p.add_argument("--warmup", choices=["on", "off", "auto"], default=None, help="the service's --warmup")
    p.add_argument("--jobs", type=parse_job, nargs="+", default=None, help="WIDTHxHEIGHT:SECONDS, in order")
    p.add_argument("--steps", type=int, default=3, help="num_inference_steps of every job (N steps: N-1 DiT calls)")
    p.add_argument(
        "--prompt",
        nargs="+",
        default=["a lighthouse at dusk, waves breaking on the rocks"],
        help="job i uses the (i mod n)-th: prompts of other lengths give the DiT other sequence lengths",
    )
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--job-timeout", type=float, default=900.0, help="seconds one job may take, queue included")
    p.add_argument("--stop-timeout", type=float, default=60.0)
    p.add_argument("--output", type=Path, default=REPO / "outputs/bench/video_service/summary.json")
    p.add_argument("--service-log", type=Path, default=None, help="default: next to --output")
    args = p.parse_args(argv)
    args.passthrough = passthrough
    if args.steps < 2:
        p.error(f"--steps must be >= 2, got {args.steps}")
    if args.jobs is None:
        shape = ("64x32", 0.5) if args.fake or args.config == "tiny" else ("1344x768", 1.0)
        args.jobs = [shape] * 3
    if not (args.fake or args.url or args.config):
        args.config = "official"
    return args


def service_flags(args: argparse.Namespace, port: int, output_dir: Path) -> list[str]:
    out = ["--host", "127.0.0.1", "--port", str(port), "--output-dir", str(output_dir), "--log-level", "info"]
    out += ["--fake", "--fake-step-delay", "0"] if args.fake else ["--config", args.config]
    for flag, value in (("--device", args.device), ("--warmup", args.warmup)):
        if value is not None:
            out += [flag, value]
    return out + args.passthrough


def dit_call_seconds(video: dict[str, Any]) -> list[float] | None:
    """The per-call DiT seconds from the job's record (the service's own output folder), when it is readable here."""
    record = video.get("metrics")
    try:
        timings = json.loads(Path(record).read_text())["result"]["timings"]
    except (TypeError, OSError, ValueError, KeyError):
        return None
    return timings.get("dit_step_s")


def run_job(client, args, size: str, seconds: float, folder: Path, index: int) -> dict[str, Any]:
    from telefuser.media import probe_media

    started = time.monotonic()
    prompt = args.prompt[index % len(args.prompt)]
    video = client.videos.create(
        prompt=prompt, size=size, seconds=f"{seconds:g}", extra_body={"num_inference_steps": args.steps}
    )
    while video.status not in FINAL:
        if time.monotonic() - started > args.job_timeout:
            raise TimeoutError(f"job {video.id} ({size}, {seconds:g} s) not final after {args.job_timeout:g} s")
        time.sleep(0.2)
        video = client.videos.retrieve(video.id)
    wall = time.monotonic() - started
    obj = video.model_dump()
    row: dict[str, Any] = {"job": index, "id": video.id, "size": size, "seconds": seconds, "prompt": prompt}
    row["status"] = video.status
    row.update(wall_s=round(wall, 3), problems=[])
    if video.status != "completed":
        row["problems"].append(f"status {video.status}: {obj.get('error')}")
        return row
    timings = obj.get("timings") or {}
    row.update(inference_s=timings.get("inference_s"), mux_s=timings.get("mux_s"), frames=obj.get("frames"))
    row.update(dit_call_s=dit_call_seconds(obj), peak_memory_mb=obj.get("peak_memory_mb"))
    path = folder / f"job{index}.mp4"
    client.videos.download_content(video.id).write_to_file(path)
    info = probe_media(path)
    width, height = (int(v) for v in obj["size"].split("x"))
    if (info.width, info.height, info.video_frames) != (width, height, obj["frames"]):
        row["problems"].append(
            f"the MP4 is {info.width}x{info.height} with {info.video_frames} frames; the job said "
            f"{obj['size']} with {obj['frames']}"
        )
    if not info.has_audio:
        row["problems"].append("the MP4 has no audio track")
    row["mp4_bytes"] = path.stat().st_size
    path.unlink()  # measured and checked: the service keeps its own copy
    return row


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """first / steady for the whole job and for the DiT call (see the module docstring)."""
    done = [r for r in rows if r["status"] == "completed" and r.get("inference_s")]
    if not done or done[0]["job"] != 0:
        return {"first_over_steady": None, "first_dit_call_over_steady": None}
    first, shape = done[0], (done[0]["size"], done[0]["seconds"])
    later = [r for r in done[1:] if (r["size"], r["seconds"]) == shape]
    job = first["inference_s"] / statistics.median(r["inference_s"] for r in later) if later else None
    calls = [c for r in later for c in (r["dit_call_s"] or [])] + (first["dit_call_s"] or [])[1:]
    dit = first["dit_call_s"][0] / statistics.median(calls) if first["dit_call_s"] and calls else None
    return {"first_over_steady": job, "first_dit_call_over_steady": dit}


def print_table(summary: dict[str, Any]) -> None:
    print(f"\n`telefuser serve` ({summary['model']}; warm-up {format_value(summary['warmup_s'])} s)")
    print("| job | size | seconds | status | wall s | inference s | DiT calls s | mux s | problems |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in summary["jobs"]:
        calls = ", ".join(f"{c:.2f}" for c in r.get("dit_call_s") or []) or "n/a"
        print(
            f"| {r['job']} | {r['size']} | {r['seconds']:g} | {r['status']} | {format_value(r['wall_s'])} | "
            f"{format_value(r.get('inference_s'))} | {calls} | {format_value(r.get('mux_s'))} | "
            f"{'; '.join(r['problems']) or '-'} |"
        )
    ratio = summary["ratios"]
    print(
        f"first / steady (inference): {format_value(ratio['first_over_steady'], 2)}; "
        f"first DiT call / steady: {format_value(ratio['first_dit_call_over_steady'], 2)}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import openai
    except ImportError:
        raise SystemExit("video_service_bench.py needs the openai package (the dev extra)") from None
    args.output.parent.mkdir(parents=True, exist_ok=True)
    service, base = None, args.url
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "jobs": [], "problems": []}
    with tempfile.TemporaryDirectory(prefix="video_bench_") as tmp:
        folder = Path(tmp)
        if base is None:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            log_path = args.service_log or args.output.with_name("service.log")
            cmd = service_command(sys.executable, "serve", 1, service_flags(args, port, folder / "service"))
            service = Service(cmd, log_path)
        try:
            if service is not None:
                summary["ready_s"] = round(service.wait_healthy(f"{base}/v1/service/health", args.startup_timeout), 3)
            status, body = http_get(f"{base}/v1/service/metadata", timeout=30)
            model = json.loads(body)["model"] if status == 200 else {}
            label = model.get("config") or model.get("runner", "?")
            summary.update(model=label, warmup_s=model.get("warmup_s"), metadata=model)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # the SDK marks its video methods deprecated
                client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
                for index, (size, seconds) in enumerate(args.jobs):
                    print(f"job {index}: {size}, {seconds:g} s, {args.steps} steps", file=sys.stderr, flush=True)
                    summary["jobs"].append(run_job(client, args, size, seconds, folder, index))
        except Exception as exc:  # noqa: BLE001 - any failure is reported in the table and the exit status
            summary["problems"].append(f"{type(exc).__name__}: {exc}")
        finally:
            if service is not None:
                rc = service.stop(timeout_s=args.stop_timeout)
                summary["service_exit_code"] = rc
                if rc != 0:
                    summary["problems"].append(f"the service exited with {rc}; see {service.log_path}")
    summary["ratios"] = ratios(summary["jobs"])
    summary.setdefault("model", "?")
    summary.setdefault("warmup_s", None)
    print_table(summary)
    problems = summary["problems"] + [f"job {r['job']}: {p}" for r in summary["jobs"] for p in r["problems"]]
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    write_json(args.output, summary)
    return 1 if problems or len(summary["jobs"]) != len(args.jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
