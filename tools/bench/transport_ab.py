"""Ulysses transports side by side on one model, for the model benches that compare them in one process.

`TransportSwitch` keeps one open communicator per transport and points the model at one; the helpers parse the list,
rotate the order per round and check that every rank holds the same arguments.
"""

from __future__ import annotations

import argparse
import functools
import os

import torch.distributed as dist

from telefuser.distributed.agreement import describe_disagreement, gather_from_ranks
from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.selection import TRANSPORTS
from telefuser.runtime import Runtime


def parse_transports(text: str) -> list[str]:
    """'portable,host-shm' -> ['portable', 'host-shm']: known names, no repeats, at least one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TRANSPORTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a comma-separated list of Ulysses transports from {', '.join(TRANSPORTS)}"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a transport twice")
    return names


def default_transports() -> list[str]:
    """What a communicator opened without a transport uses: $TELEFUSER_ULYSSES_TRANSPORT, else auto."""
    return [os.environ.get("TELEFUSER_ULYSSES_TRANSPORT") or "auto"]


def rotated(names: list[str], iteration: int) -> list[str]:
    """The order of one timed round: every transport goes first equally often. A pure function of the arguments,
    so every rank switches at the same points."""
    shift = iteration % len(names)
    return names[shift:] + names[:shift]


def agree_on_arguments(args: argparse.Namespace) -> None:
    """Every rank must hold the same arguments: they decide which communicator each collective runs on."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        problem = describe_disagreement("the bench arguments", gather_from_ranks(sorted(vars(args).items()), None))
        if problem:
            raise SystemExit(problem)  # the same list on every rank, so every rank stops here


class TransportSwitch:
    """One open communicator per transport on one model; `use(name)` points the model's blocks at it.

    The first transport's communicator comes from `runtime.parallelize` (the plan of `spec`, the model's spec); the
    others are opened on the same Ulysses group, in the given order, on every rank alike. The model reads
    `model.communicator` at every forward, so switching is a local assignment: no collective, nothing re-opened.
    Sessions must be made after `use` (the model refuses sessions made for another parallel layout). Without a
    communicator (one rank) `use` does nothing."""

    def __init__(self, model, spec, runtime: Runtime, transports: list[str]):
        self.model, self.transports = model, transports
        self.communicators: dict[str, UlyssesCommunicator] = {}
        if runtime.mesh is None:
            return
        first = functools.partial(UlyssesCommunicator, transport=transports[0])
        runtime.parallelize(model, spec, communicator_factory=first)
        if model.communicator is None:
            return
        self.communicators[transports[0]] = model.communicator
        for name in transports[1:]:
            self.communicators[name] = UlyssesCommunicator(model.ulysses_group, transport=name)

    def use(self, name: str) -> None:
        if self.communicators:
            self.model.communicator = self.communicators[name]

    def runs_on(self, name: str) -> str:
        comm = self.communicators.get(name)
        return comm.transport if comm is not None else "none (one rank)"

    def fallback_reasons(self, name: str) -> dict[str, str]:
        comm = self.communicators.get(name)
        return dict(comm.fallback_reasons) if comm is not None else {}

    def close(self) -> None:
        """Local: close every communicator, then let the model drop its group."""
        for comm in self.communicators.values():
            comm.close()
        self.model.communicator = None
        self.model.close()
