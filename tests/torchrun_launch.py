"""Run a script under `torchrun --standalone` from the repository root, as the tool tests do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_torchrun(nproc: int, *args: str, timeout: float, unset: tuple[str, ...] = ()) -> tuple[int, str]:
    """(exit status, stdout + stderr); the whole process group is killed, and the test fails, past `timeout`.
    `unset`: environment variables the run must not inherit."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    full_env = {k: v for k, v in os.environ.items() if k not in unset}
    full_env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(command)} ran past {timeout:.0f} s (hang?):\n{output[-4000:]}")
    return proc.returncode, output
