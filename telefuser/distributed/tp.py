"""Tensor-parallel styles for `nn.Linear` layers, independent of any model (torchtitan's ColwiseParallel /
RowwiseParallel, for plain tensors).

A style says which pieces of a full weight a TP rank keeps (`pieces`) and which collective, if any, restores the
layer's output (`hook`, a forward hook). A model's plan maps module-name patterns to styles (e.g.
``models/minimax_h3/tp.py``); `apply_plan` slices the planned layers, real or meta weights, and adds the hooks. A
checkpoint loader reads the same pieces (`cut` on a full tensor), so each rank reads only its slices.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

Index = tuple[slice, ...]


def _rank_range(length: int, rank: int, size: int, what: str) -> slice:
    if length % size:
        raise ValueError(f"{what} of length {length} does not split over {size} TP ranks")
    part = length // size
    return slice(rank * part, (rank + 1) * part)


def cut(tensor: torch.Tensor, pieces: list[Index]) -> torch.Tensor:
    """The `pieces` of `tensor`, concatenated along dim 0 (a copy, contiguous)."""
    parts = [tensor[index] for index in pieces]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).clone(memory_format=torch.contiguous_format)


@dataclass(frozen=True)
class ColwiseSections:
    """Split the output of each of `sections` stacked matrices (Q|K|V, gate|up); outputs stay local."""

    sections: int

    def pieces(self, shape: tuple[int, ...], rank: int, size: int) -> list[Index]:
        if shape[0] % self.sections:
            raise ValueError(f"{shape[0]} rows do not split into {self.sections} sections")
        rows = shape[0] // self.sections
        local = _rank_range(rows, rank, size, "a section")
        return [(slice(s * rows + local.start, s * rows + local.stop),) for s in range(self.sections)]

    def hook(self, group, size):
        return None


@dataclass(frozen=True)
class ColwiseGathered:
    """Split the output; all-gather the outputs along the last dimension."""

    def pieces(self, shape: tuple[int, ...], rank: int, size: int) -> list[Index]:
        return [(_rank_range(shape[0], rank, size, "the output"),)]

    def hook(self, group, size):
        def all_gather_output(module, inputs, output):
            parts = [torch.empty_like(output) for _ in range(size)]
            dist.all_gather(parts, output.contiguous(), group=group)
            return torch.cat(parts, dim=-1)

        return all_gather_output


@dataclass(frozen=True)
class Rowwise:
    """Split the input (the weight's columns); all-reduce the partial outputs. Bias-free layers only."""

    def pieces(self, shape: tuple[int, ...], rank: int, size: int) -> list[Index]:
        if len(shape) != 2:
            raise ValueError("a row-wise split of a biased linear layer would add its bias on every rank")
        return [(slice(None), _rank_range(shape[1], rank, size, "the input"))]

    def hook(self, group, size):
        def all_reduce_output(module, inputs, output):
            dist.all_reduce(output, group=group)
            return output

        return all_reduce_output


class Style(Protocol):
    """What a plan maps a linear layer to (the classes above)."""

    def pieces(self, shape: tuple[int, ...], rank: int, size: int) -> list[Index]: ...

    def hook(self, group, size): ...  # a forward hook, or None when the output needs no collective


Plan = Mapping[str, Style]  # module-name pattern (fnmatch) -> style; the first pattern that matches wins


@dataclass(frozen=True)
class TensorParallelState:
    """What a model split by `apply_plan` keeps: the TP group and this rank's place in it."""

    group: dist.ProcessGroup
    rank: int
    size: int


def planned_style(plan: Plan, module_name: str) -> Style | None:
    """The style `plan` gives the module named `module_name`; None when it is not split."""
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(module_name, pattern):
            return style
    return None


def apply_plan(model: nn.Module, plan: Plan, group: dist.ProcessGroup, rank: int, size: int) -> TensorParallelState:
    """Slice every linear layer `plan` names to this rank's part (real or meta weights) and add its collective."""
    for name, module in model.named_modules():
        style = planned_style(plan, name)
        if style is None:
            continue
        if not isinstance(module, nn.Linear):
            raise TypeError(f"the TP plan expects {name} to be nn.Linear, got {type(module).__name__}")
        for pname in ("weight", "bias"):
            param = getattr(module, pname)
            if param is not None:
                local = cut(param.detach(), style.pieces(tuple(param.shape), rank, size))
                setattr(module, pname, nn.Parameter(local, requires_grad=False))
        module.out_features, module.in_features = module.weight.shape
        hook = style.hook(group, size)
        if hook is not None:
            module.register_forward_hook(hook)
    return TensorParallelState(group, rank, size)
