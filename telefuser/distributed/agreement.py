"""Agreeing on a decision across ranks before anyone acts on it.

Each rank contributes what it saw (its input's description or its local error) and every rank reads the same list,
so a bad input raises the same error everywhere instead of leaving good ranks in a collective the bad one never joins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


def gather_from_ranks(value: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's `value`, indexed by rank within `group` (None: the world); one small collective."""
    if dist.get_world_size(group) == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def first_error(errors: Sequence[str | None]) -> str | None:
    """One message for all ranks: the shared error, or each failing rank's error."""
    failing = [(r, e) for r, e in enumerate(errors) if e is not None]
    if not failing:
        return None
    if len({e for _, e in failing}) == 1 and len(failing) == len(errors):
        return failing[0][1]
    return "; ".join(f"rank {r}: {e}" for r, e in failing)


def describe_disagreement(what: str, values: Sequence[Any]) -> str | None:
    """None when all ranks hold the same value, else a message listing each rank's value."""
    if all(v == values[0] for v in values):
        return None
    listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
    return f"ranks disagree on {what} ({listing})"


def agree(what: str, decide: Callable[[], T], group: dist.ProcessGroup | None = None, *, advice: str = "") -> T:
    """`decide()` on this rank, then one outcome on every rank of `group` (None: the world): the value when all ranks
    decided the same, else the same error everywhere: each rank's own exception when every rank failed alike, or a
    RuntimeError naming each rank's error or value (`advice` appended). Without a process group, `decide()`."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return decide()
    value, error, raised = None, None, None
    try:
        value = decide()
    except Exception as exc:  # noqa: BLE001 - shared with the other ranks, then raised everywhere
        error, raised = f"{type(exc).__name__}: {exc}", exc
    views = gather_from_ranks((value, error), group)
    errors = [e for _, e in views]
    message = first_error(errors)
    if message is not None:
        if raised is not None and all(e == error for e in errors):
            raise raised
        raise RuntimeError(f"{what}: {message}{advice}")
    disagreement = describe_disagreement(what, [v for v, _ in views])
    if disagreement:
        raise RuntimeError(f"{disagreement}{advice}")
    return value
