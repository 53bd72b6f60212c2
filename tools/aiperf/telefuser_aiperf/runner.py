"""Shared plumbing of the benchmark runners: the service process, health, metrics scraping, running AIPerf.

Standard library only (the runners run in the engine's venv; AIPerf runs from .venv-aiperf as a subprocess).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .artifacts import parse_prometheus

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_AIPERF = REPO_ROOT / ".venv-aiperf" / "bin" / "aiperf"
DEFAULT_TOKENIZER = REPO_ROOT / "tools" / "aiperf" / "fixtures" / "tokenizer"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_bench_config(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """An AIPerf YAML config with ${VAR:default} resolved the way AIPerf resolves it (env, else the default)."""
    import yaml  # PyYAML: in the engine's venv (a transformers dependency)

    env = dict(os.environ if env is None else env)
    text = _ENV_REF.sub(lambda m: env.get(m.group(1), m.group(2) or ""), Path(path).read_text())
    return yaml.safe_load(text)


def bench_section(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("benchmark") or {}


def planned_requests(config: dict[str, Any]) -> int:
    phases = bench_section(config).get("phases") or bench_section(config).get("profiling") or {}
    if isinstance(phases, list):
        phases = next((p for p in phases if not p.get("excludeFromResults")), phases[-1])
    requests = phases.get("requests")
    if not isinstance(requests, int):
        raise ValueError("the benchmark config must fix the request count (phases.requests) for a lossless check")
    return requests


def endpoint_extra(config: dict[str, Any]) -> dict[str, Any]:
    return dict((bench_section(config).get("endpoint") or {}).get("extra") or {})


def prepare_artifact_dir(path: Path) -> Path:
    """A fresh directory; an old AIPerf artifact directory at that path is removed, anything else is refused."""
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        known = {
            "logs",
            "inputs.json",
            "profile_export_aiperf.json",
            "telefuser_summary.json",
            "service.log",
            "aiperf_console.log",
            ".aiperf_results_ready.json",
        }
        if not any((path / k).exists() for k in known):
            raise SystemExit(f"{path} exists and is not an AIPerf artifact directory; choose another --artifact-dir")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def http_get(url: str, timeout: float = 10.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_healthy(
    url: str, timeout_s: float, *, service: Service | None = None, headers: dict[str, str] | None = None
) -> float:
    """Seconds until GET `url` (a /v1/service/health) answered 200 {"status": "ok"}. RuntimeError names the last
    answer or error, and a started `service`'s log tail when it exited or never became healthy."""
    started, last = time.monotonic(), "no answer yet"
    while time.monotonic() - started < timeout_s:
        if service is not None and service.proc.poll() is not None:
            raise RuntimeError(
                f"the service exited with {service.proc.returncode} before {url} was healthy; "
                f"its log ({service.log_path}) ends:\n{service.tail()}"
            )
        try:
            status, body = http_get(url, timeout=5, headers=headers)
            if status == 200 and json.loads(body).get("status") == "ok":
                return time.monotonic() - started
            last = f"{status} {body[:200].decode(errors='replace')}"
        except (OSError, ValueError, AttributeError) as exc:  # refused, reset, timed out; a body that is not JSON
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(1.0 if service is not None else 0.5)
    tail = f"; its log ({service.log_path}) ends:\n{service.tail()}" if service is not None else ""
    raise RuntimeError(f"GET {url} did not answer 200 status ok within {timeout_s:g} s (last: {last}){tail}")


def scrape_metrics(url: str, headers: dict[str, str] | None = None) -> dict:
    """The service's Prometheus samples (GET {url}/v1/service/metrics); RuntimeError when it does not answer 200."""
    status, body = http_get(f"{url}/v1/service/metrics", timeout=30, headers=headers)
    if status != 200:
        raise RuntimeError(f"GET {url}/v1/service/metrics answered {status}: {body[:300]!r}")
    return parse_prometheus(body.decode())


class Service:
    """A service process in its own process group, so that SIGINT reaches every torchrun rank like a Ctrl-C."""

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.cmd = cmd
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")
        print("== service: " + " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.started = time.monotonic()

    def wait_healthy(self, url: str, timeout_s: float) -> float:
        """Seconds from the start until `url` answered healthy (see `wait_healthy`)."""
        wait_healthy(url, timeout_s, service=self)
        return time.monotonic() - self.started

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGINT to the group (clean shutdown), then SIGTERM, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGINT, timeout_s), (signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    print(f"== service did not stop after {sig.name}; escalating", flush=True)
        self._log.close()
        return self.proc.returncode

    def stop_and_check(self, timeout_s: float, *, torchrun: bool) -> tuple[int | None, str | None]:
        """(exit code, the problem when the service did not stop cleanly)."""
        rc = self.stop(timeout_s=timeout_s)
        if self.stopped_cleanly(rc, torchrun=torchrun):
            return rc, None
        return rc, f"the service did not exit cleanly (exit code {rc}); see {self.log_path}"

    def stopped_cleanly(self, returncode: int | None, *, torchrun: bool) -> bool:
        """Exit 0; under torchrun, whose agent exits 1 on SIGINT by design, rank 0's own clean-exit log line counts."""
        if returncode == 0:
            return True
        return torchrun and returncode == 1 and "exited cleanly" in self.tail(400)

    def tail(self, lines: int = 40) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def model_flags(args: argparse.Namespace, fake_flags: list[str], optional: dict[str, Any]) -> list[str]:
    """The service's model flags: `fake_flags` under --fake, else --config; then `--flag value` for every set value."""
    out = list(fake_flags) if args.fake else ["--config", args.config]
    for flag, value in optional.items():
        if value is not None:
            out += [flag, str(value)]
    return out


def service_command(python: str, subcommand: str, nproc: int, args: list[str]) -> list[str]:
    """`python -m telefuser.cli <subcommand> ...`, under torchrun (`python -m torch.distributed.run`) when nproc > 1."""
    if nproc > 1:
        head = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m"]
    else:
        head = [python, "-m"]
    return head + ["telefuser.cli", subcommand] + args


def start_service(args, cmd: list[str], artifact_dir: Path, url: str, run: dict[str, Any]) -> "Service":
    """Start the service `cmd` (OMP_NUM_THREADS from --threads), wait for its health endpoint, record how in `run`."""
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    run["service_threads"] = env.get("OMP_NUM_THREADS")
    service = Service(cmd, artifact_dir / "service.log", env=env)
    run["service_command"] = cmd
    try:
        ready_s = service.wait_healthy(f"{url}/v1/service/health", args.startup_timeout)
    except BaseException:  # never leave a service in its own session running behind a failed start (or Ctrl-C)
        service.stop(timeout_s=10.0)
        raise
    run["service_ready_s"] = round(ready_s, 3)
    print(f"== service healthy after {run['service_ready_s']} s", flush=True)
    return service


def run_aiperf(
    aiperf: Path, config: Path, artifact_dir: Path, url: str, *, tokenizer: Path, timeout_s: float | None
) -> tuple[int, float]:
    """`aiperf profile --config` from the repository root (config paths are relative to it); console to a log too."""
    aiperf = Path(aiperf)
    if not aiperf.exists():
        raise SystemExit(f"{aiperf} not found: run tools/aiperf/setup_env.sh (make aiperf-env) first")
    env = dict(os.environ)
    env.update({"TF_BENCH_URL": url, "TF_BENCH_ARTIFACT_DIR": str(artifact_dir), "TF_BENCH_TOKENIZER": str(tokenizer)})
    env.pop("HF_HUB_OFFLINE", None)  # AIPerf 0.13.0 sends local tokenizer paths to the HF cache when it is set
    env.pop("VIRTUAL_ENV", None)
    cmd = [str(aiperf), "profile", "--config", str(config)]
    print("== aiperf: " + " ".join(cmd), flush=True)
    started = time.monotonic()
    log_path = Path(artifact_dir) / "aiperf_console.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def copy() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                sys.stdout.buffer.write(line)
                sys.stdout.flush()

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"== aiperf ran past {timeout_s:g} s; interrupting it", flush=True)
            proc.send_signal(signal.SIGINT)
            try:
                rc = proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
        reader.join(10)
    sys.stdout.flush()
    return rc, time.monotonic() - started


def write_json(path: Path, data: Any) -> None:
    Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """A bench's own arguments (before ``--``) and the service flags after it, passed on verbatim."""
    if "--" not in argv:
        return list(argv), []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def format_value(value: Any, digits: int = 3) -> str:
    """A table cell: n/a for a missing value, floats to `digits` places."""
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def bench_parser(description: str, default_config: Path, service: str, checkpoint_help: str):
    """(parser, service group) with what both benchmark runners take first: the bench config, where artifacts go,
    and the model options every service has. The caller adds its own service options, then `add_launch_options`."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--bench-config", type=Path, default=default_config, help="AIPerf YAML config (tools/aiperf/configs)"
    )
    p.add_argument("--artifact-dir", type=Path, default=None, help="default: outputs/aiperf/<config name>")
    p.add_argument("--summary", type=Path, default=None, help="default: <artifact dir>/telefuser_summary.json")
    m = p.add_argument_group(f"service ({service})")
    m.add_argument("--config", choices=("tiny", "official"), default="tiny", help="model config")
    m.add_argument("--checkpoint", default=None, help=checkpoint_help)
    m.add_argument("--nproc", type=int, default=1, help="GPUs / ranks; >1 runs the service under torchrun")
    m.add_argument("--device", default=None, help="cpu, cuda, ... (default: the service's choice)")
    m.add_argument("--dtype", default=None)
    return p, m


def add_launch_options(p: argparse.ArgumentParser, m) -> None:
    """How the service is reached or started, and where AIPerf is."""
    m.add_argument("--service-url", default=None, help="benchmark an already running service instead of starting one")
    m.add_argument("--port", type=int, default=None, help="default: a free port")
    m.add_argument("--python", default=sys.executable, help="interpreter that runs the service (the engine's)")
    m.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS of the service (default: inherited; the Makefile exports 1)",
    )
    m.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds to wait for /v1/service/health")
    a = p.add_argument_group("AIPerf")
    a.add_argument("--aiperf", type=Path, default=DEFAULT_AIPERF)
    a.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    a.add_argument("--aiperf-timeout", type=float, default=None, help="seconds before AIPerf is interrupted")
