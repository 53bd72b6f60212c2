"""Tensor parallelism for the MiniMax H3 DiT, as a plan beside the dense model (torchtitan style).

It names which linears split how, slices their weights and adds each split's one collective as a hook (QKV, fc1 and
the AdaLN table split by output; out_proj and fc2 by input, then all-reduce). The loader reads the same pieces.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from types import MappingProxyType

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


MINIMAX_H3_TP_PLAN = MappingProxyType(
    {
        "*.attn.qkv_proj": ColwiseSections(3),
        "*.attn.out_proj": Rowwise(),
        "*.mlp.fc1": ColwiseSections(2),
        "*.mlp.fc2": Rowwise(),
        "*.adaln_proj.linear": ColwiseGathered(),
    }
)


@dataclass(frozen=True)
class TensorParallelState:
    group: dist.ProcessGroup
    rank: int
    size: int


def style_for(module_name: str, plan=MINIMAX_H3_TP_PLAN):
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(module_name, pattern):
            return style
    return None


def tensor_pieces(key: str, shape: tuple[int, ...], rank: int, size: int) -> list[Index] | None:
    """The pieces of the full tensor `key` (model name, full `shape`) this TP rank keeps, concatenated along dim 0;
    None when the plan does not split it (or there is no TP)."""
    style = style_for(key.rpartition(".")[0])
    if style is None or size == 1:
        return None
    return style.pieces(tuple(shape), rank, size)


def shard_tensor(key: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's part of a full tensor (unchanged when the plan does not split it); contiguous."""
    pieces = tensor_pieces(key, tuple(tensor.shape), rank, size)
    return tensor if pieces is None else cut(tensor, pieces)


def check_divisible(config, size: int) -> None:
    sizes = {
        "num_attention_heads": config.num_attention_heads,
        "ffn_hidden_size": config.ffn_hidden_size,
        "adaln_out_features": config.adaln_out_features,
        "final_adaln_out_features": config.final_adaln_out_features,
    }
    bad = [f"{name}={value}" for name, value in sizes.items() if value % size]
    if bad:
        raise ValueError(f"tp_degree {size} does not divide {', '.join(bad)}")


def apply_tensor_parallel(model: nn.Module, group: dist.ProcessGroup, rank: int, size: int) -> TensorParallelState:
    """Slice every planned linear layer to this rank's part (real or meta weights) and add its collective."""
    check_divisible(model.config, size)
    for name, module in model.named_modules():
        style = style_for(name)
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
