"""Tensor parallelism for the MiniMax H3 DiT, as a plan beside the dense model (torchtitan style).

It names which linears split how (QKV, fc1 and the AdaLN table split by output; out_proj and fc2 by input, then
all-reduce); the styles, the slicing and their collectives are `telefuser.distributed.tp`'s. The loader reads the
same pieces (`tensor_pieces`).
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import torch.distributed as dist
from torch import nn

from ...distributed.tp import (
    ColwiseGathered,
    ColwiseSections,
    Index,
    Rowwise,
    Style,
    TensorParallelState,
    apply_plan,
    cut,
    planned_style,
)

MINIMAX_H3_TP_PLAN = MappingProxyType(
    {
        "*.attn.qkv_proj": ColwiseSections(3),
        "*.attn.out_proj": Rowwise(),
        "*.mlp.fc1": ColwiseSections(2),
        "*.mlp.fc2": Rowwise(),
        "*.adaln_proj.linear": ColwiseGathered(),
    }
)


def style_for(module_name: str) -> Style | None:
    """How the plan splits the module named `module_name`; None when it does not."""
    return planned_style(MINIMAX_H3_TP_PLAN, module_name)


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
    return apply_plan(model, MINIMAX_H3_TP_PLAN, group, rank, size)
