"""Replicas of `telefuser serve` / `serve-stream` as real processes on loopback (each in its own process group, so
a test can SIGKILL one the way a lost host ends it), started side by side and stopped after."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx

from tools.harness.server_process import ServerProcess
from tools.harness.service_servers import free_port


class Replica(ServerProcess):
    def __init__(self, command: str, args: list[str], *, name: str, env: dict[str, str] | None = None):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(["telefuser", command, "--port", str(self.port), "--log-level", "warning", *args], env=env)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.url}/v1/service/health", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"replica {self.name} did not start:\n{self.log}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                super().stop(signal.SIGTERM, timeout_s=20)
            except AssertionError:
                pass  # killed after 20 s: stopping is best effort here, the tests read what the replicas did


def start_replicas(command: str, common: list[str], names: list[str], **kw) -> list[Replica]:
    """Start one replica per name (`--replica-id NAME` plus `common`) side by side; wait until all serve."""
    replicas = [Replica(command, ["--replica-id", name, *common], name=name, **kw) for name in names]
    try:
        for replica in replicas:
            replica.wait_ready()
    except BaseException:
        stop_all(replicas)
        raise
    return replicas


def stop_all(replicas: list[Replica]) -> None:
    for replica in replicas:
        replica.stop()


def read_run_log(path: Path) -> list[dict]:
    """The fake runner's run log (--fake-run-log): one JSON object per run start, end or cancel."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate, timeout_s: float, what: str):
    """`predicate()`'s first truthy value, polled every 50 ms; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.05)
    return value
