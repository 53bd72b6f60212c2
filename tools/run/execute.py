"""Run one step: its command in its own process group, with its time limit, its output in its own log."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tools.run.steps import CARRIED_SITE, Step, expand

KILL_GRACE_S = 5  # after the limit: SIGTERM to the group, then SIGKILL this much later (as `timeout -k`)


@dataclass
class Checkout:
    """Where a step runs: the tree, or a --baseline copy of an earlier commit (its own code, the tree's machine)."""

    label: str  # "tree" or "baseline"
    root: Path
    out: Path  # the step's {out}

    def log_name(self, step: Step) -> str:
        return f"{step.name}.log" if self.label == "tree" else f"{step.name}.{self.label}.log"


@dataclass
class StepResult:
    step: str
    checkout: str
    status: str  # "0", "1", ..., "timeout", "skipped"
    seconds: float
    log: str
    command: str
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("0", "skipped")


def step_env(step: Step, checkout: Checkout, plan_env: dict[str, str]) -> dict[str, str]:
    # the checkout first on PYTHONPATH, so a baseline's own `telefuser` and `tools` are the ones imported
    path = [str(checkout.root), str(CARRIED_SITE), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        **plan_env,
        **step.env,
        "PYTHONPATH": ":".join(p for p in path if p),
        "PYTHONUNBUFFERED": "1",
    }


def run_command(command: list[str], *, cwd: Path, env: dict[str, str], log: Path, limit_s: float) -> str:
    """The exit status as text, or "timeout"; the whole process group goes when the limit is reached."""
    with open(log, "a") as f:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return str(proc.wait(timeout=limit_s))
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            f.write(f"\n# stopped: the step ran past its limit of {limit_s:g} s\n")
            return "timeout"
        except BaseException:  # Ctrl-C or a signal: take the step's processes (torchrun ranks too) with us
            _stop_group(proc)
            raise


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(step: Step, checkout: Checkout, *, python: str, log_dir: Path, plan_env: dict[str, str]) -> StepResult:
    log = log_dir / checkout.log_name(step)
    command, unmatched = expand(step.argv, python=python, out=checkout.out, cwd=checkout.root)
    globs = [t for t in step.argv if "*" in t]
    env = step_env(step, checkout, plan_env)
    shown = " ".join(command)
    log.write_text(f"$ {shown}\n# cwd: {checkout.root}\n# env: {dict(step.env)}\n")
    if globs and len(unmatched) == len(globs):
        return StepResult(step.name, checkout.label, "skipped", 0.0, log.name, shown, f"no file matches {unmatched}")
    if step.skip_if:
        check, _ = expand(step.skip_if, python=python, out=checkout.out, cwd=checkout.root)
        if run_command(check, cwd=checkout.root, env=env, log=log, limit_s=60) == "0":
            note = f"not needed: `{' '.join(check)}` succeeded"
            return StepResult(step.name, checkout.label, "skipped", 0.0, log.name, shown, note)
    checkout.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    status = run_command(command, cwd=checkout.root, env=env, log=log, limit_s=step.limit_s)
    return StepResult(step.name, checkout.label, status, time.monotonic() - started, log.name, shown)


def tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
