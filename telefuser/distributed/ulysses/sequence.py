"""Splitting a sequence's rows over the Ulysses group and gathering them back.

Each rank owns one contiguous block of rows; the sequence is zero-padded to a multiple of the group size so that
every rank holds the same number (the scatter needs equal shares). The model drops the padding rows after gathering.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def rank_rows(rows: int, rank: int, world: int) -> tuple[slice, int]:
    """Rank `rank`'s slice of `rows` rows padded to a multiple of `world`, and the padded length."""
    local = -(-rows // world)
    return slice(rank * local, (rank + 1) * local), local * world


def take_rows(x: torch.Tensor, rows: slice, padded: int) -> torch.Tensor:
    """Rows `rows` of x ``[B, N, C]`` zero-padded to `padded` rows."""
    if x.shape[1] < padded:
        x = F.pad(x, (0, 0, 0, padded - x.shape[1]))
    return x[:, rows]


def gather_rows(x: torch.Tensor, group: dist.ProcessGroup, communicator=None) -> torch.Tensor:
    """Every rank's rows ``[B, S_local, C]`` of `group`, in rank order: ``[B, W*S_local, C]`` on every rank.

    With the group's `communicator` the gather goes through it: on the copy engine where the group cannot move
    device tensors itself (processes sharing a GPU over gloo), which a CUDA graph can also capture."""
    if communicator is not None:
        return communicator.gather_rows(x).wait()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


__all__ = ["gather_rows", "rank_rows", "take_rows"]
