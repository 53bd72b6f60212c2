"""What a plan is made of: steps (one command each, with a time limit) and the placeholders their commands use."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Placeholders a step's command may use; they are filled in per checkout when the step runs (see `expand`).
PY = "{py}"  # the interpreter of this run (--python)
OUT = "{out}"  # the folder for the step's JSON/media: OUT for the tree, OUT/baseline for the baseline checkout
SITE = "{site}"  # where carried wheels are installed (`pip --target`); it is on every step's PYTHONPATH

CARRIED_SITE = Path("/tmp/site")


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: int
    argv: tuple[str, ...]
    what: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    # a command that, when it succeeds, makes this step unnecessary (e.g. tf_kernel is importable already)
    skip_if: tuple[str, ...] = ()
    # prepares the machine (wheels, builds): runs in the tree only, never again for a --baseline checkout
    setup: bool = False


@dataclass(frozen=True)
class Plan:
    name: str
    what: str
    steps: tuple[Step, ...]
    gpus: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    # a checkout every step also runs in (interleaved) when --baseline is not given; None: the tree alone
    baseline: str | None = None
    # suggested --steps groups, one per device call (a call is limited in time)
    calls: tuple[str, ...] = ()

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]


def command(text: str) -> tuple[str, ...]:
    """A step's command written as a shell line (quotes group words; nothing else of a shell applies)."""
    return tuple(shlex.split(text))


def module(text: str) -> tuple[str, ...]:
    """`python -m <module> <args>`: the tools import each other as packages of the checkout."""
    return command(f"{PY} -m {text}")


def torchrun(ranks: int, text: str) -> tuple[str, ...]:
    """`module` under torchrun, `ranks` processes."""
    return command(f"{PY} -m torch.distributed.run --standalone --nproc-per-node={ranks} -m {text}")


def pytest(text: str) -> tuple[str, ...]:
    return command(f"{PY} -m pytest -q -rs --tb=short -p no:cacheprovider -p no:logging {text}")


def expand(argv: tuple[str, ...], *, python: str, out: Path, cwd: Path) -> tuple[list[str], list[str]]:
    """(the command with its placeholders filled and globs expanded from `cwd`, the globs that matched nothing)."""
    command, unmatched = [], []
    for token in argv:
        token = token.replace(PY, python).replace(OUT, str(out)).replace(SITE, str(CARRIED_SITE))
        if "*" in token:
            matches = sorted(str(p.relative_to(cwd)) for p in cwd.glob(token))
            command += matches
            if not matches:
                unmatched.append(token)
        else:
            command.append(token)
    return command, unmatched
