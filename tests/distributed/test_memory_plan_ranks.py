"""The memory plan under torchrun-like gloo ranks: every rank plans for the smallest budget and gets the same plan,
a refusal is the same error on every rank (nobody is left in a collective), and streamed weights under Ulysses give
the resident model's numbers."""

from __future__ import annotations

import argparse
from unittest import mock

import numpy as np
import torch

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.memory.budget import DeviceBudget
from telefuser.memory.plan import MemoryPlanError
from telefuser.models.registry import get_spec
from telefuser.runtime import Runtime

REQUEST = {"duration": 5, "resolution": "768", "steps": 9}


def _plan_with_budgets(ctx, budgets_gib: list[float]):
    """The official MiniMax H3 plan with each rank measuring its own budget (`budgets_gib[rank]`), as if on CUDA."""
    mesh = build_mesh(ParallelConfig(ulysses_degree=ctx.world_size))
    runtime = Runtime(mesh, torch.device("cuda", 0), torch.bfloat16)  # planned for, never touched
    spec = get_spec("minimax_h3")
    args = argparse.Namespace(config="official", checkpoint=None, quantization="none", offload="auto")
    gib = budgets_gib[ctx.rank]
    measured = DeviceBudget(int(gib * 2**30), int(gib * 2**30), f"{gib:g} GiB on rank {ctx.rank}")
    with (
        mock.patch("telefuser.memory.budget.device_budget", return_value=measured),
        mock.patch("telefuser.memory.budget.host_budget_bytes", return_value=1 << 40),
        mock.patch("telefuser.memory.budget.hold_to"),
    ):
        try:
            plan = spec.memory_plan(args, runtime, REQUEST)
        except MemoryPlanError as exc:
            return "refused", str(exc)
    return plan.placement.tier, dict(plan.placement.resident), plan.budget_source


def test_every_rank_plans_for_the_smallest_budget(ranks2):
    results = ranks2.run(_plan_with_budgets, [72.0, 28.0])
    assert results[0] == results[1]  # one plan on both ranks
    tier, resident, source = results[0]
    assert tier == "block" and "rank 1, the smallest" in source


def test_a_request_that_fits_no_rank_is_refused_alike_on_every_rank(ranks2):
    results = ranks2.run(_plan_with_budgets, [72.0, 4.0])
    assert [r[0] for r in results] == ["refused", "refused"] and results[0][1] == results[1][1]
    assert "does not fit" in results[0][1]


def _lingbot_frames(ctx, streamed: bool):
    """A tiny LingBot session under Ulysses over the ranks, its DiT blocks and text encoder streamed or resident."""
    from telefuser.memory.plan import Placement
    from telefuser.pipelines.lingbot_world_v2.loading import build_lingbot_pipeline

    mesh = build_mesh(ParallelConfig(ulysses_degree=ctx.world_size))
    placement = None
    if streamed:
        placement = Placement("block", {"dit": 1, "text_encoder": 0}, frozenset({"dit", "text_encoder"}))
    pipe = build_lingbot_pipeline(
        config="tiny", runtime=Runtime(mesh, torch.device("cpu"), torch.float32), placement=placement
    )
    image = np.full((96, 128, 3), 90, np.uint8)
    with pipe.start(image, "a walk in the park", resolution="128x96", num_frames=29) as session:
        frames = np.concatenate([session.next_chunk(["w"]).frames for _ in range(session.total_chunks)])
    pipe.close()
    return frames


def test_streamed_blocks_under_ulysses_equal_the_resident_model(ranks2):
    resident = ranks2.run(_lingbot_frames, False)
    streamed = ranks2.run(_lingbot_frames, True)
    for got, want in zip(streamed, resident):
        assert np.array_equal(got, want)
