"""`python -m tools.bench.stream_drive`: the arguments, and the run: service -> plan -> sessions -> metrics -> verdict."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from telefuser.models.flags import SIZES
from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from tools.aiperf.telefuser_aiperf.artifacts import check_stream_service, stream_service_deltas
from tools.aiperf.telefuser_aiperf.runner import REPO_ROOT, split_passthrough, write_json
from tools.bench import stream_drive
from tools.bench.stream_drive import service
from tools.bench.stream_drive.plan import DrivePlan, RunError, load_plan
from tools.bench.stream_drive.progress import log
from tools.bench.stream_drive.report import add_sessions
from tools.bench.stream_drive.table import print_table

try:
    import httpx

    from tools.bench.stream_drive.driver import Context, SessionDriver
except ImportError as _missing:
    raise SystemExit(
        f"the stream drive needs httpx and websockets>=14 (the service's own wheels): {_missing}"
    ) from None

DEFAULT_BENCH = REPO_ROOT / "tools/aiperf/configs/stream_lingbot_world_v2_1min.yaml"
DEFAULT_OUTPUT = REPO_ROOT / "outputs/bench/stream_drive/summary.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    argv, passthrough = split_passthrough(argv)
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.stream_drive",
        description=stream_drive.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s = p.add_argument_group("service (started here unless --url)")
    s.add_argument("--url", default=None, help="benchmark a running service (http://host:port) instead of starting one")
    s.add_argument(
        "--api-key", default=os.environ.get("TELEFUSER_API_KEY"), help="Bearer key (default $TELEFUSER_API_KEY)"
    )
    s.add_argument("--config", choices=SIZES, default="official", help="model config (default official)")
    s.add_argument("--checkpoint", default=None, help="checkpoint directory (the service uses random weights without)")
    s.add_argument("--device", default=None, help="cpu, cuda, ... (default: the service's: its GPU, else cpu)")
    s.add_argument("--dtype", default=None, help="model dtype (default: the service's, bfloat16 on CUDA)")
    s.add_argument("--vae-dtype", default=None, help="passed on as --vae-dtype when given (the service must have it)")
    # the model's own flags (telefuser/models/lingbot_world_v2/spec.py); None: the service's default
    LINGBOT_WORLD_V2.add_flags(s, only=("attn_impl", "quantization"), attn_impl=None, quantization=None)
    s.add_argument("--warmup", choices=("auto", "on", "off"), default=None, help="service warm-up (default auto: CUDA)")
    s.add_argument("--buffer-chunks", type=int, default=None, help="the service's delivery queue, in chunks")
    s.add_argument("--jpeg-quality", type=int, default=None)
    s.add_argument("--max-sessions", type=int, default=None, help="default: --concurrency")
    s.add_argument("--fake", action="store_true", help="the service's test-pattern model instead of LingBot-World v2")
    s.add_argument("--fake-delay", type=float, default=0.25, help="--fake: seconds of 'compute' per chunk")
    s.add_argument("--nproc", type=int, default=1, help="ranks; > 1 runs the service under torchrun")
    s.add_argument("--port", type=int, default=None, help="default: a free port")
    s.add_argument("--python", default=sys.executable, help="interpreter of the service (default: this one)")
    s.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the service (default: inherited)")
    s.add_argument("--service-log", type=Path, default=None, help="default: service.log beside --output")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds for a started service to be healthy")
    s.add_argument("--connect-timeout", type=float, default=30.0, help="seconds for --url to be healthy; WS handshake")
    s.add_argument("--stop-timeout", type=float, default=60.0, help="seconds after SIGINT before SIGTERM, SIGKILL")
    w = p.add_argument_group("sessions")
    w.add_argument("--bench-config", type=Path, default=DEFAULT_BENCH, help="AIPerf YAML whose session plan to drive")
    frames = w.add_mutually_exclusive_group()
    frames.add_argument("--num-frames", type=int, default=None, help="frames per session (default: the bench config's)")
    frames.add_argument("--chunks", type=int, default=None, help="chunks per session (frames from the model's chunks)")
    w.add_argument("--controls", default=None, help="control trace JSON (default: the bench config's; '' for none)")
    w.add_argument("--control-timing", choices=("trace", "asap"), default="trace", help="see the description")
    w.add_argument("--prompt", default=None, help="default: the bench config's dataset")
    w.add_argument("--image", type=Path, default=None, help="start frame (default: the bench config's dataset)")
    w.add_argument("--seed", type=int, default=None)
    w.add_argument("--resolution", default=None, help="WxH, the session's and the started service's default")
    w.add_argument("--codec", choices=("jpeg", "png", "raw"), default=None, help="frame codec (default: the service's)")
    w.add_argument("--sessions", type=int, default=1, help="sessions to run (default 1)")
    w.add_argument("--concurrency", type=int, default=1, help="sessions at a time (default 1)")
    w.add_argument("--ws-compression", choices=("deflate", "off"), default="deflate", help="deflate: as a browser")
    w.add_argument("--no-decode", action="store_true", help="do not decode the frames (sizes and counts still checked)")
    w.add_argument("--create-timeout", type=float, default=600.0, help="seconds for the create answer")
    w.add_argument("--slot-wait", type=float, default=120.0, help="seconds to retry a create answered 429 (busy)")
    w.add_argument("--stall-timeout", type=float, default=300.0, help="longest silence on the WebSocket, in seconds")
    w.add_argument("--ack-wait", type=float, default=30.0, help="seconds for the service's delivery_ack answer")
    w.add_argument("--session-timeout", type=float, default=7200.0, help="seconds one whole session may take")
    w.add_argument("--no-metric-checks", action="store_true", help="report the metrics deltas but do not judge them")
    o = p.add_argument_group("output")
    o.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON summary (default %(default)s)")
    o.add_argument("--progress", choices=("auto", "tqdm", "lines", "none"), default="auto")
    args = p.parse_args(argv)
    args.passthrough = passthrough
    for name in ("sessions", "concurrency", "nproc"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.chunks is not None and args.chunks < 1:
        p.error("--chunks must be >= 1")
    if args.url and (args.fake or passthrough):
        p.error("--fake and service flags after -- need a service started here, not --url")
    return args


class Run:
    """What the run holds while it goes, so that a failure or a signal still reports the sessions it had."""

    def __init__(self, args: argparse.Namespace, summary: dict[str, Any]):
        self.args, self.summary = args, summary
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.service: service.Service | None = None
        self.decoder = concurrent.futures.ThreadPoolExecutor(1, "decode")
        self.drivers: list[SessionDriver] = []
        self.started_ns: int | None = None
        self.wall_s: float | None = None

    async def drive(self) -> None:
        args, summary = self.args, self.summary
        plan = load_plan(args)  # fail on a bad plan before a model is loaded
        base = await self._service()
        meta = await service.metadata(base, self.headers)
        model = meta.get("model") or {}
        summary["service"]["metadata"] = {"model": model, "limits": meta.get("limits")}
        plan = self._plan_for(plan, model)
        summary["plan"] = self._plan_summary(plan, meta)
        before = await service.metrics(base, self.headers)
        await self._sessions(plan, base)
        after = await service.metrics(base, self.headers)
        deltas = stream_service_deltas(before, after)
        summary["service_metrics"] = {"deltas": deltas, **service.metric_phases(deltas, before, after)}
        if not args.no_metric_checks:
            frames = sum(d.state.counted_frames for d in self.drivers)
            checks = check_stream_service(deltas, len(self.drivers), frames)
            summary["problems"] += [f"service metrics: {p}" for p in checks]

    async def _service(self) -> str:
        args = self.args
        if args.url:
            base = args.url.rstrip("/")
            ready = await service.healthy(base, args.connect_timeout, None, self.headers)
        else:
            self.service, base = service.start(args)
            self.summary["service"].update(command=self.service.cmd, log=str(self.service.log_path))
            log(f"waiting up to {args.startup_timeout:g} s for {base}/v1/service/health (model load, warm-up)")
            ready = await service.healthy(base, args.startup_timeout, self.service, self.headers)
        self.summary["service"].update(url=base, ready_s=round(ready, 3))
        log(f"service healthy at {base} after {ready:.1f} s")
        return base

    def _plan_for(self, plan: DrivePlan, model: dict[str, Any]) -> DrivePlan:
        """--chunks becomes a frame count from the model's chunk sizes in the metadata."""
        if self.args.chunks is None:
            return plan
        cf = model.get("chunk_frames") or {}
        if not isinstance(cf.get("first"), int) or not isinstance(cf.get("later"), int):
            raise RunError(f"--chunks needs the model's chunk_frames in the metadata (got {cf!r}); give --num-frames")
        return load_plan(self.args, (cf["first"], cf["later"]))

    def _plan_summary(self, plan: DrivePlan, meta: dict[str, Any]) -> dict[str, Any]:
        options = plan.options
        return {
            **plan.source,
            "config": options.config,
            "codec": options.wire.get("codec") or meta.get("default_codec"),
            "controls": [
                {"keys": list(s.keys), "delay_s": s.delay_s, "after_chunk": s.after_chunk} for s in options.controls
            ],
            "control_timing": self.args.control_timing,
            "sessions": self.args.sessions,
            "concurrency": self.args.concurrency,
        }

    async def _sessions(self, plan: DrivePlan, base: str) -> None:
        args = self.args
        async with httpx.AsyncClient(trust_env=False, headers=self.headers, timeout=30) as http:
            ctx = Context(args, base, http, plan, self.decoder, self.headers)
            gate = asyncio.Semaphore(args.concurrency)
            log(
                f"{args.sessions} session(s) of {plan.options.requested_frames} frames, {args.concurrency} at a time, "
                f"controls: {len(plan.options.controls)} step(s), timing {args.control_timing}"
            )

            async def one(number: int) -> None:
                async with gate:
                    driver = SessionDriver(number, ctx)
                    self.drivers.append(driver)  # reported even when the run is cut short
                    await driver.run()

            self.started_ns = time.perf_counter_ns()
            await asyncio.gather(*(one(n) for n in range(1, args.sessions + 1)))
            self.wall_s = (time.perf_counter_ns() - self.started_ns) / 1e9

    def finish(self) -> None:
        self.decoder.shutdown(wait=False, cancel_futures=True)
        service.stop(self.args, self.summary, self.service)
        add_sessions(self.summary, self.drivers, self.started_ns, self.wall_s)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.output = args.output if args.output.is_absolute() else Path.cwd() / args.output
    for name in ("no_proxy", "NO_PROXY"):  # urllib here and in any child: loopback never via a proxy
        os.environ[name] = ",".join(filter(None, (os.environ.get(name), "127.0.0.1,localhost")))

    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)  # still stop the service when we are terminated
    started = time.monotonic()
    summary: dict[str, Any] = {
        "tool": "tools.bench.stream_drive",
        "argv": argv,
        "output": str(args.output),
        "service": {"started_here": not args.url},
        "problems": [],
        "warnings": [],
    }
    run = Run(args, summary)
    try:
        asyncio.run(run.drive())
    except RunError as exc:
        summary["problems"].append(str(exc))
    except KeyboardInterrupt:
        summary["problems"].append("interrupted (Ctrl-C)")
    except SystemExit as exc:
        summary["problems"].append(f"terminated (exit {exc.code})")
    except Exception as exc:  # noqa: BLE001 - a bug here must still stop the service and say what happened
        summary["problems"].append(f"the stream drive failed: {type(exc).__name__}: {exc}")
    finally:
        run.finish()
    summary["wall_s"] = round(time.monotonic() - started, 3)
    if not summary.get("sessions") and not summary["problems"]:
        summary["problems"].append("no session ran")
    summary["passed"] = not summary["problems"]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.output, summary)
    print_table(summary)
    return 0 if summary["passed"] else 1
