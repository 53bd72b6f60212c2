"""telefuser.distributed.tp on one process: the pieces each style keeps, `cut`, and `apply_plan`'s slicing. The
collectives themselves run under TP2 in tests/distributed (test_minimax_h3_parity, test_minimax_h3_lora_tp)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from telefuser.distributed.tp import ColwiseGathered, ColwiseSections, Rowwise, apply_plan, cut, planned_style


def _full(rows: int, columns: int) -> torch.Tensor:
    return torch.arange(rows * columns, dtype=torch.float32).view(rows, columns)


def test_column_sections_keep_the_same_rows_of_every_section():
    full = _full(12, 2)  # three sections (Q|K|V) of 4 rows
    parts = [cut(full, ColwiseSections(3).pieces(tuple(full.shape), rank, 2)) for rank in range(2)]
    for rank, part in enumerate(parts):
        expected = torch.cat([full[s * 4 + rank * 2 : s * 4 + rank * 2 + 2] for s in range(3)])
        assert torch.equal(part, expected) and part.is_contiguous()
    with pytest.raises(ValueError, match="13 rows do not split into 3 sections"):
        ColwiseSections(3).pieces((13, 2), 0, 2)


def test_gathered_columns_and_rows_split_their_dimension_and_refuse_what_does_not_divide():
    full = _full(6, 4)
    assert torch.equal(cut(full, ColwiseGathered().pieces((6, 4), 1, 2)), full[3:])
    assert torch.equal(cut(full, Rowwise().pieces((6, 4), 1, 2)), full[:, 2:])
    with pytest.raises(ValueError, match="the output of length 6 does not split over 4 TP ranks"):
        ColwiseGathered().pieces((6, 4), 0, 4)
    with pytest.raises(ValueError, match="would add its bias on every rank"):
        Rowwise().pieces((6,), 0, 2)


def test_the_first_matching_pattern_names_the_style():
    plan = {"*.qkv": ColwiseSections(3), "*.out": Rowwise(), "*": ColwiseGathered()}
    assert planned_style(plan, "blocks.0.qkv") == ColwiseSections(3)
    assert planned_style(plan, "blocks.0.out") == Rowwise()
    assert planned_style({"*.qkv": Rowwise()}, "blocks.0.norm") is None


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)
        self.out = nn.Linear(4, 4, bias=False)
        self.norm = nn.LayerNorm(4)


def test_apply_plan_slices_planned_linears_and_hooks_only_the_collective_styles():
    torch.manual_seed(0)
    model = nn.Sequential(_Block())
    dense = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    state = apply_plan(model, {"*.qkv": ColwiseSections(3), "*.out": Rowwise()}, group=None, rank=1, size=2)
    block = model[0]
    assert (state.rank, state.size) == (1, 2)
    assert (block.qkv.out_features, block.qkv.in_features) == (6, 4)
    assert torch.equal(block.qkv.bias, torch.cat([dense["0.qkv.bias"][s * 4 + 2 : s * 4 + 4] for s in range(3)]))
    assert (block.out.out_features, block.out.in_features) == (4, 2)
    assert torch.equal(block.out.weight, dense["0.out.weight"][:, 2:])
    assert torch.equal(block.norm.weight, dense["0.norm.weight"])  # not planned: untouched
    assert not block.qkv._forward_hooks and len(block.out._forward_hooks) == 1  # only the row split all-reduces
    assert not block.qkv.weight.requires_grad


def test_apply_plan_slices_meta_weights_and_refuses_a_planned_module_that_is_not_linear():
    with torch.device("meta"):
        model = nn.Sequential(_Block())
    apply_plan(model, {"*.qkv": ColwiseSections(3)}, group=None, rank=0, size=2)
    assert model[0].qkv.weight.is_meta and tuple(model[0].qkv.weight.shape) == (6, 4)
    with pytest.raises(TypeError, match="expects 0.norm to be nn.Linear, got LayerNorm"):
        apply_plan(model, {"*.norm": Rowwise()}, group=None, rank=0, size=2)
