"""Agreeing on a decision across ranks before anyone acts on it.

Each rank contributes what it saw (its input's description or its local error) and every rank reads the same list,
so a bad input raises the same error everywhere instead of leaving good ranks in a collective the bad one never joins.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch.distributed as dist


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
