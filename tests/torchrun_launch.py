"""Run a script under torchrun from the repository root, as the tool tests do: `--standalone` (one node), or as one
agent of a multi-node launch (`start_torchrun` with the node's flags)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def start_torchrun(launch: list[str], *args: str, unset: tuple[str, ...] = ()) -> subprocess.Popen:
    """torchrun with the launch flags `launch` running `args`, in its own process group, stdout + stderr piped.
    `unset`: environment variables the run must not inherit."""
    full_env = {k: v for k, v in os.environ.items() if k not in unset}
    full_env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *launch, *args],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """(exit status, output) of each; past `timeout` every process group is killed and the test fails."""
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            output, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            results.append((proc.returncode, output))
        return results
    except subprocess.TimeoutExpired:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
        tails = [proc.communicate()[0][-4000:] for proc in procs]
        pytest.fail(f"{' '.join(procs[0].args)} ran past {timeout:.0f} s (hang?):\n" + "\n".join(tails))


def run_torchrun(nproc: int, *args: str, timeout: float, unset: tuple[str, ...] = ()) -> tuple[int, str]:
    """(exit status, stdout + stderr) of a one-node run of `nproc` processes."""
    return finish([start_torchrun(["--standalone", f"--nproc-per-node={nproc}"], *args, unset=unset)], timeout)[0]
