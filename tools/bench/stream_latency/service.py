"""The service a latency run measures: `telefuser serve-stream` started here on a free loopback port (its own process
group; the AIPerf runners' process plumbing), or one already running at --url."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tools.aiperf.telefuser_aiperf.runner import Service, free_port, service_command, wait_healthy


def add_service_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("service (started here unless --url)")
    g.add_argument("--url", default=None, help="measure a service that is running (e.g. http://127.0.0.1:8088)")
    g.add_argument("--api-key", default=os.environ.get("TELEFUSER_API_KEY"), help="its key, if it needs one")
    model = g.add_mutually_exclusive_group()
    model.add_argument("--fake", action="store_true", help="the test-pattern model (default unless --config)")
    model.add_argument("--config", choices=("tiny", "official"), default=None, help="LingBot-World v2 sizes")
    g.add_argument("--checkpoint", default=None, help="LingBot-World v2 weights (with --config official)")
    g.add_argument("--device", default=None, help="the service's --device (default: its own choice)")
    g.add_argument("--fake-delay", type=float, default=0.25, help="--fake: seconds of compute per chunk (default 0.25)")
    g.add_argument("--fake-pattern", choices=("scene", "noise"), default="scene", help="--fake: what frames show")
    g.add_argument("--delivery-mode", choices=("realtime", "lossless"), default="realtime", help="(default realtime)")
    g.add_argument("--buffer-chunks", type=int, default=None, help="the service's --buffer-chunks (default: its own)")
    g.add_argument("--nproc", type=int, default=1, help="ranks (torchrun when > 1; default 1)")
    g.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the service")
    g.add_argument("--startup-timeout", type=float, default=900, help="seconds for the service to be healthy")
    g.add_argument("--service-log", type=Path, default=None, help="where its log goes (default: a temp file)")


def session_frames(presses: int) -> int:
    """Frames enough for a run of `presses` (LingBot-World v2 takes no open-ended session): 13 + 16k, k = eight chunks
    of warm-up and twelve a press (a press and its release, each up to a buffer's lead in lossless mode); the run
    stops the session when it is done."""
    return 13 + 16 * (8 + 12 * presses)


def serve_flags(args: argparse.Namespace, port: int, extra: list[str] = ()) -> list[str]:
    out = ["--host", "127.0.0.1", "--port", str(port), "--delivery-mode", args.delivery_mode, "--max-sessions", "1"]
    if args.config:
        out += ["--config", args.config]
        out += ["--checkpoint", args.checkpoint] if args.checkpoint else []
    else:
        out += ["--fake", "--fake-delay", str(args.fake_delay), "--fake-pattern", args.fake_pattern]
    for flag, value in (("--device", args.device), ("--buffer-chunks", args.buffer_chunks)):
        if value is not None:
            out += [flag, str(value)]
    return out + list(extra) + list(getattr(args, "serve_args", None) or [])  # after --: serve-stream flags, verbatim


@contextlib.contextmanager
def running_service(args: argparse.Namespace, extra: list[str] = ()) -> Iterator[str]:
    """Yield the base URL of the service to measure; a service started here is stopped (SIGINT, then harder) after."""
    if args.url:
        yield args.url.rstrip("/")
        return
    port = free_port()
    cmd = service_command(sys.executable, "serve-stream", args.nproc, serve_flags(args, port, extra))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    log_path = args.service_log or Path(tempfile.mkdtemp(prefix="stream-latency-")) / "service.log"
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the table's
        service = Service(cmd, log_path, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{base}/v1/service/health", args.startup_timeout, service=service)
        yield base
    finally:
        with contextlib.redirect_stdout(sys.stderr):
            service.stop(timeout_s=30)
