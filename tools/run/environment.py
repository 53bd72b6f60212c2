"""OUT/env.txt: what machine and software a run measured on (best effort: a missing tool is noted, not fatal)."""

from __future__ import annotations

import subprocess
from pathlib import Path

PROBES = (
    ("git", ["git", "log", "-1", "--format=%H %cd"]),
    ("gpus", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
    ("cpus", ["nproc"]),
)
PYTHON_PROBE = (
    "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
)


def describe(python: str, cwd: Path) -> str:
    lines = []
    for label, command in (*PROBES, ("python", [python, "-c", PYTHON_PROBE])):
        try:
            done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
            lines.append(f"{label}: {(done.stdout or done.stderr).strip()}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines.append(f"{label}: unavailable ({type(exc).__name__})")
    return "\n".join(lines) + "\n"
