"""The run's record: OUT/summary.md (a table and every log's tail) and OUT/logs.tar.gz (everything small under OUT),
rewritten after every step so that a call cut short still brings its evidence back."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

from tools.run.execute import StepResult, tail

TARBALL = "logs.tar.gz"
LEFT_OUT_SUFFIXES = (".mp4", ".pt", ".safetensors", ".nsys-rep")  # media and tensors: too large to bring back
MAX_FILE_BYTES = 50 * 2**20


def write_summary(out: Path, plan: str, results: list[StepResult], tail_lines: int = 30) -> Path:
    lines = [
        f"# {plan} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "| step | checkout | rc | s | note |",
        "| --- | --- | --- | ---: | --- |",
    ]
    lines += [f"| {r.step} | {r.checkout} | {r.status} | {r.seconds:.0f} | {r.note} |" for r in results]
    for r in results:
        lines += ["", f"## {r.step} ({r.checkout})", "", f"`{r.command}`", "", "```", tail(out / r.log, tail_lines)]
        lines += ["```"]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_tarball(out: Path) -> Path:
    """OUT/logs.tar.gz of every file under OUT but media, tensors and files over MAX_FILE_BYTES."""
    target, partial = out / TARBALL, out / f".{TARBALL}.partial"
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(out.rglob("*")):
            if not path.is_file() or path in (target, partial) or path.suffix in LEFT_OUT_SUFFIXES:
                continue
            if path.stat().st_size <= MAX_FILE_BYTES:
                tar.add(path, arcname=str(path.relative_to(out)))
    partial.replace(target)
    return target
