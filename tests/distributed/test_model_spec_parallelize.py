"""Each real model's spec applies its plan through `Runtime.parallelize` on gloo ranks: TP first, then Ulysses.

The communicator factory records what the model looked like when Ulysses opened, so the order is checked, not
assumed; an empty (meta) model takes the same plan, as the checkpoint loader needs it to."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, LingBotWorldV2DiT
from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from telefuser.models.minimax_h3 import MiniMaxH3Config, MiniMaxH3DiT
from telefuser.models.minimax_h3.spec import MINIMAX_H3
from telefuser.runtime import Runtime


def _opened_after(model, seen: list):
    def factory(group):
        tp = model.tensor_parallel
        seen.append((tp.size if tp is not None else None, dist.get_process_group_ranks(group)))
        return UlyssesCommunicator(group)

    return factory


def _minimax_tp2_u2(ctx, on_meta: bool):
    mesh = build_mesh(ParallelConfig(ulysses_degree=2, tp_degree=2))
    config = MiniMaxH3Config.tiny()
    with torch.device("meta" if on_meta else "cpu"):
        model = MiniMaxH3DiT(config)
    seen: list = []
    runtime = Runtime(mesh, torch.device("cpu"), torch.float32)
    assert runtime.parallelize(model, MINIMAX_H3, communicator_factory=_opened_after(model, seen)) is model
    qkv = model.blocks[0].attn.qkv_proj
    try:
        runtime.parallelize(model, MINIMAX_H3)
        refused = None
    except ValueError as exc:
        refused = str(exc)
    model.close()
    return seen, qkv.out_features, qkv.weight.is_meta, dist.get_process_group_ranks(mesh.ulysses_group), refused


@pytest.mark.parametrize("on_meta", [False, True], ids=["weights", "meta"])
def test_minimax_spec_applies_tp_then_ulysses(ranks4, on_meta):
    config = MiniMaxH3Config.tiny()
    for seen, qkv_rows, is_meta, ulysses_ranks, refused in ranks4.run(_minimax_tp2_u2, on_meta):
        assert seen == [(2, ulysses_ranks)]  # Ulysses opened once, over the Ulysses group, after TP split the model
        assert qkv_rows == 3 * config.num_attention_heads * config.attention_head_dim // 2
        assert is_meta == on_meta
        assert "already split for tp_degree 2" in refused


def _lingbot(ctx, tp: int):
    mesh = build_mesh(ParallelConfig(ulysses_degree=ctx.world_size // tp, tp_degree=tp))
    model = LingBotWorldV2DiT(LingBotWorldV2Config.tiny())
    runtime = Runtime(mesh, torch.device("cpu"), torch.float32)
    try:
        runtime.parallelize(model, LINGBOT_WORLD_V2)
    except ValueError as exc:
        return str(exc)
    world = model.communicator.world_size
    model.close()
    return world


def test_lingbot_spec_applies_ulysses_and_refuses_tp(ranks4):
    assert ranks4.run(_lingbot, 1) == [4] * 4
    assert all("Ulysses only" in message for message in ranks4.run(_lingbot, 2))
