"""Tensor parallelism for the MiniMax H3 DiT, as a plan beside the model (torchtitan style).

The model code stays dense; this plan says which linear layers are split and how, slices their weights, and adds the
one collective each split needs as a forward hook:

* ``attn.qkv_proj``: output split per Q/K/V section, so every rank keeps heads [r*H/tp, (r+1)*H/tp) of each of Q, K
  and V and the local fused view stays ``[B, S, 3, H/tp, D]``. No communication.
* ``attn.out_proj``: input split over the same heads; partial outputs are summed by an all-reduce.
* ``mlp.fc1``: output split per gate/up section (silu_and_mul stays local); ``mlp.fc2``: input split + all-reduce.
* ``adaln_proj.linear``: output split, all-gathered into the full table.

The same slicing serves the checkpoint loader (`shard_tensor`), so a checkpoint loads the same way with or without
TP: the loader reads full tensors and keeps this rank's slice. Slicing is one-way for a model instance.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.distributed as dist
from torch import nn


def _rank_slice(tensor: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    if tensor.shape[dim] % size:
        raise ValueError(f"dimension {dim} of shape {tuple(tensor.shape)} does not split over {size} TP ranks")
    return tensor.chunk(size, dim=dim)[rank]


@dataclass(frozen=True)
class ColwiseSections:
    """Split the output of each of `sections` stacked matrices (Q|K|V, gate|up); outputs stay local."""

    sections: int

    def shard(self, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        stacked = tensor.view(self.sections, -1, *tensor.shape[1:])
        return _rank_slice(stacked, 1, rank, size).reshape(-1, *tensor.shape[1:])

    def hook(self, group, size):
        return None


@dataclass(frozen=True)
class ColwiseGathered:
    """Split the output; all-gather the outputs along the last dimension."""

    def shard(self, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        return _rank_slice(tensor, 0, rank, size)

    def hook(self, group, size):
        def all_gather_output(module, inputs, output):
            parts = [torch.empty_like(output) for _ in range(size)]
            dist.all_gather(parts, output.contiguous(), group=group)
            return torch.cat(parts, dim=-1)

        return all_gather_output


@dataclass(frozen=True)
class Rowwise:
    """Split the input (the weight's columns); all-reduce the partial outputs. Bias-free layers only."""

    def shard(self, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        if tensor.dim() != 2:
            raise ValueError("a row-wise split of a biased linear layer would add its bias on every rank")
        return _rank_slice(tensor, 1, rank, size)

    def hook(self, group, size):
        def all_reduce_output(module, inputs, output):
            dist.all_reduce(output, group=group)
            return output

        return all_reduce_output


MINIMAX_H3_TP_PLAN = MappingProxyType({
    "*.attn.qkv_proj": ColwiseSections(3),
    "*.attn.out_proj": Rowwise(),
    "*.mlp.fc1": ColwiseSections(2),
    "*.mlp.fc2": Rowwise(),
    "*.adaln_proj.linear": ColwiseGathered(),
})


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


def shard_tensor(key: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's part of a full checkpoint tensor (unchanged when the plan does not split it); contiguous."""
    style = style_for(key.rpartition(".")[0])
    if style is None or size == 1:
        return tensor
    return style.shard(tensor, rank, size).clone(memory_format=torch.contiguous_format)


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
                local = style.shard(param.detach(), rank, size).clone(memory_format=torch.contiguous_format)
                setattr(module, pname, nn.Parameter(local, requires_grad=False))
        module.out_features, module.in_features = module.weight.shape
        hook = style.hook(group, size)
        if hook is not None:
            module.register_forward_hook(hook)
    return TensorParallelState(group, rank, size)
