"""The memory plan's arithmetic, the tier choice and its refusals, and layer streaming on the CPU.

Weights are counted from meta-built modules, so the plan's stacks must add up to exactly what a built model holds
(data movement: exact). A streamed model computes with the same values from other tensors, so its outputs equal the
resident model's exactly; the negative control (two layers' host copies swapped) differs by order 1."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from telefuser.distributed.mesh import ParallelConfig
from telefuser.memory.host import layer_tensors
from telefuser.memory.plan import (
    GIB,
    MemoryPlan,
    MemoryPlanError,
    Placement,
    Stack,
    Stage,
    Workload,
    choose,
    placement_for,
    plan_tier,
)
from telefuser.memory.streaming import StreamedLayers, streamed_layers

REPO = Path(__file__).resolve().parents[2]


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# -- the arithmetic on a hand-made workload ---------------------------------------------------------------------------
def _toy(per_request_text: bool = True) -> Workload:
    return Workload(
        title="toy",
        stacks=(
            Stack("dit", fixed=10, layer=100, count=8),
            Stack("text_encoder", fixed=50, layer=40, count=5, per_request=per_request_text, fixed_offloads=True),
            Stack("vae", fixed=30, per_request=True, fixed_offloads=True),
        ),
        held={"latents": 7},
        stages=(
            Stage("text", uses=("text_encoder",), transient={"prompt": 3}),
            Stage("denoise", uses=("dit",), transient={"activations": 60}),
            Stage("decode", uses=("vae",), transient={"decode": 20}),
        ),
    )


def test_each_tier_keeps_what_it_says_on_the_device():
    toy = _toy()
    none = MemoryPlan(toy, placement_for(toy, "none"), None, "")
    assert none.peak_bytes == 10 + 800 + 50 + 200 + 30 + 7 + 60 and none.host_bytes == 0
    model = MemoryPlan(toy, placement_for(toy, "model"), None, "")
    # text encoder and VAE off the device; the text stage holds two streamed layers and the (lent) fixed part
    assert model.resident_bytes() == {"dit": 810, "text_encoder": 0, "vae": 0}
    assert model.stage_bytes() == {"text": 3 + 2 * 40 + 50, "denoise": 60, "decode": 20 + 30}
    assert model.peak_bytes == 810 + 7 + 133 and model.host_bytes == 200 + 50 + 30
    block = MemoryPlan(toy, placement_for(toy, "block"), None, "")
    assert block.resident_bytes()["dit"] == 10 and block.stage_bytes()["denoise"] == 60 + 2 * 100
    assert block.host_bytes == 800 + 200 + 50 + 30


def test_spare_budget_keeps_leading_layers_resident_every_step_stacks_first():
    toy = _toy()
    # block tier: fixed 10 + held 7 + the denoise stage (60 + two streamed slots of 100) is 277; the budget keeps
    # four more DiT layers resident, and leaves nothing for a text-encoder layer (40 more)
    plan = plan_tier(toy, "block", 277 + 4 * 100, "")
    assert plan.fits and plan.peak_bytes == 677
    assert plan.placement.resident["dit"] == 4 and plan.placement.resident["text_encoder"] == 0
    wider = plan_tier(toy, "block", 277 + 4 * 100 + 40, "")
    assert wider.placement.resident == {"dit": 4, "text_encoder": 1, "vae": 0}
    everything = plan_tier(toy, "block", 10**6, "")
    assert everything.placement.resident == {"dit": 8, "text_encoder": 5, "vae": 0}


def test_auto_takes_the_cheapest_tier_that_fits_and_refuses_with_what_would():
    toy = _toy()
    none_peak = MemoryPlan(toy, placement_for(toy, "none"), None, "").peak_bytes
    assert choose(toy, none_peak, budget_source="x").placement.tier == "none"
    assert choose(toy, none_peak - 1, budget_source="x").placement.tier == "model"
    assert choose(toy, 400, budget_source="x").placement.tier == "block"
    smaller = Workload("smaller", (Stack("dit", fixed=10, layer=10, count=8),), (Stage("d", ("dit",)),))
    with pytest.raises(MemoryPlanError) as refused:
        choose(toy, 100, budget_source="a 100-byte card", alternatives=[("--smaller", smaller)])
    message = str(refused.value)
    assert "does not fit" in message and "a 100-byte card" in message
    assert "--offload none needs" in message and "--offload block needs" in message
    assert "what would fit: --smaller --offload none" in message
    with pytest.raises(MemoryPlanError, match="this launch runs on the CPU"):
        choose(toy, 10**6, tier="block", tiers=("none",))
    with pytest.raises(MemoryPlanError, match="pinned host memory"):
        choose(toy, 400, budget_source="x", host_bytes=10)


def test_stacks_that_take_turns_are_lent_whole_in_the_model_tier_and_streamed_in_the_block_tier():
    # two experts that run one after the other (Wan 2.2 T2V-A14B's): fixed 10 + 4 layers of 100 each
    experts = tuple(
        Stack(name, fixed=10, layer=100, count=4, per_request=True, fixed_offloads=True, whole_until_block=True)
        for name in ("high", "low")
    )
    load = Workload(
        "turns",
        experts,
        (Stage("high", uses=("high",), transient={"a": 60}), Stage("low", uses=("low",), transient={"a": 60})),
    )
    model = MemoryPlan(load, placement_for(load, "model"), None, "")
    assert model.resident_bytes() == {"high": 0, "low": 0} and model.stage_bytes() == {"high": 470, "low": 470}
    assert model.host_bytes == 2 * 410 and "high lent whole" in model.summary()
    block = MemoryPlan(load, placement_for(load, "block"), None, "")
    assert block.resident_bytes() == {"high": 10, "low": 10}  # the fixed parts stay; the layers stream
    assert block.stage_bytes() == {"high": 60 + 2 * 100, "low": 60 + 2 * 100} and block.host_bytes == 2 * 400
    # spare budget keeps layers of a streamed expert resident, never of one lent whole
    assert plan_tier(load, "model", 10**6, "").placement.resident == {"high": 0, "low": 0}
    filled = plan_tier(load, "block", 20 + 260 + 100, "")
    assert filled.placement.resident == {"high": 1, "low": 0} and filled.peak_bytes == 380


def test_a_refused_tier_is_never_chosen():
    toy = _toy()
    refused = Workload(toy.title, toy.stacks, toy.stages, toy.held, refused_tiers={"block": "no graphs"})
    with pytest.raises(MemoryPlanError, match="no graphs"):
        choose(refused, 400, tier="block")
    with pytest.raises(MemoryPlanError, match="--offload model needs"):
        choose(refused, 400)  # auto: none and model only


# -- the models' workloads count what the built models hold -------------------------------------------------------
def _minimax_args(**kw):
    return argparse.Namespace(**{"config": "tiny", "checkpoint": None, "quantization": "none", **kw})


@pytest.mark.parametrize("quantization", ["none", "fp8"])
def test_minimax_stacks_add_up_to_the_built_pipeline(quantization):
    from telefuser.pipelines.minimax_h3.loading import build_minimax_h3_pipeline
    from telefuser.pipelines.minimax_h3.memory import workload
    from telefuser.runtime import Runtime

    if quantization == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    args = _minimax_args(quantization=quantization)
    load = workload(args, ParallelConfig(), torch.float32, {"duration": 1, "resolution": "32", "steps": 3})
    pipe = build_minimax_h3_pipeline(
        config="tiny", runtime=Runtime.one_rank("cpu", torch.float32), quantization=quantization
    )
    dit = pipe.dit
    adaln = [t for p in dit.adaln_projections() for t in layer_tensors(p)]
    adaln_ids = {id(t) for t in adaln}
    assert load.stack("adaln").total == _bytes(adaln)
    assert load.stack("dit").total == _bytes(t for t in layer_tensors(dit) if id(t) not in adaln_ids)
    assert load.stack("dit").layer * len(dit.blocks) == _bytes(
        t for b in dit.blocks for t in layer_tensors(b) if id(t) not in adaln_ids
    )
    assert load.stack("text_encoder").total == _bytes(layer_tensors(pipe.prompt_encoder.encoder))
    vaes = layer_tensors(pipe.video_decoder.vae) + layer_tensors(pipe.audio_decoder.vae)
    assert load.stack("vae").total == _bytes(vaes)


def test_lingbot_stacks_add_up_to_the_built_pipeline():
    from telefuser.pipelines.lingbot_world_v2.loading import build_lingbot_pipeline
    from telefuser.pipelines.lingbot_world_v2.memory import workload
    from telefuser.runtime import Runtime

    args = argparse.Namespace(
        config="tiny", checkpoint=None, quantization="none", attn_impl="sdpa", vae_dtype="float32", cuda_graphs="auto"
    )
    load = workload(args, ParallelConfig(), torch.float32, {"resolution": "128x96"})
    pipe = build_lingbot_pipeline(config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))
    assert load.stack("dit").total == _bytes(layer_tensors(pipe.dit))
    assert load.stack("dit").layer * len(pipe.dit.blocks) == _bytes(layer_tensors(pipe.dit.blocks))
    assert load.stack("text_encoder").total == _bytes(pipe.prompt_encoder.encoder.parameters())
    assert load.stack("vae").total == _bytes(pipe.vae.model.parameters())


def test_official_minimax_plans_fit_the_cards_users_have():
    """The official 1344x768 5 s request with 8 DiT calls on one GPU, bf16: 80 GB streams what runs once per request,
    32 and 24 GB stream the DiT's blocks; the arithmetic of those weights is the model's (61.7 GiB DiT)."""
    from telefuser.pipelines.minimax_h3.memory import workload

    load = workload(
        _minimax_args(config="official"),
        ParallelConfig(),
        torch.bfloat16,
        {"duration": 5, "resolution": "768", "steps": 9},
    )
    dit_gib = (load.stack("dit").total + load.stack("adaln").total) / GIB
    assert 61.5 < dit_gib < 62.0 and 24.0 < load.stack("adaln").total / GIB < 24.5
    tiers = {card: choose(load, int(0.9 * card * GIB)).placement.tier for card in (141, 80, 32, 24)}
    assert tiers == {141: "none", 80: "model", 32: "block", 24: "block"}


def test_entry_point_refuses_a_request_that_cannot_fit_before_loading(tmp_path):
    """The official MiniMax request on this CPU machine's memory: one message, exit status 2, nothing loaded."""
    out = subprocess.run(
        [sys.executable, str(REPO / "examples/minimax_h3/run_t2va.py"), "--config", "official", "--device", "cpu"]
        + ["--output", str(tmp_path / "x.mp4"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not fit" in errors[0] and "--offload none needs" in errors[0]
    assert "Traceback" not in out.stderr and not (tmp_path / "x.mp4").exists()


def test_plan_command_prints_every_tier_and_the_choice():
    from telefuser.cli import main

    code = main(["plan", "--model", "minimax_h3", "--config", "official", "--gpu-memory-gb", "32"])
    assert code == 0


# -- streaming on the CPU -------------------------------------------------------------------------------------------
def _stack() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(5))


def _run(stack, x, stream=None):
    for _, layer in stream.each() if stream is not None else enumerate(stack):
        x = layer(x)
    return x


@pytest.mark.parametrize("resident", [0, 2, 5])
def test_streamed_stack_equals_resident_exactly_and_every_layer_goes_back(resident):
    stack = _stack()
    x = torch.randn(4, 16)
    want = _run(stack, x)
    stream = StreamedLayers(stack, "cpu", resident=resident, keep_slots=True)
    assert stream.streamed == streamed_layers(5, resident) and len(stream.streamed) == 5 - resident
    host = {i: [t.data_ptr() for t in layer_tensors(stack[i])] for i in stream.streamed}
    for _ in range(2):
        assert torch.equal(_run(stack, x, stream), want)
    assert {i: [t.data_ptr() for t in layer_tensors(stack[i])] for i in stream.streamed} == host
    assert stream.host_bytes == (5 - resident) * stream.slot_bytes


def test_streamed_layers_spread_through_the_stack():
    assert streamed_layers(10, 5) == [1, 3, 5, 7, 9] and streamed_layers(4, 0) == [0, 1, 2, 3]
    assert streamed_layers(50, 14) == sorted(set(streamed_layers(50, 14))) and len(streamed_layers(50, 14)) == 36
    assert streamed_layers(3, 3) == []


def test_streamed_stack_computes_from_slots_not_from_host_copies():
    """Negative control: two layers' host copies swapped make the streamed stack compute the wrong layers."""
    stack = _stack()
    x = torch.randn(4, 16)
    want = _run(stack, x)
    stream = StreamedLayers(stack, "cpu", keep_slots=False)
    stream._host[1], stream._host[3] = stream._host[3], stream._host[1]
    assert (_run(stack, x, stream) - want).abs().max() > 1e-2


def test_hooks_stream_a_library_loop_and_free_the_slots_after_the_pass():
    stack = _stack()
    x = torch.randn(4, 16)
    want = _run(stack, x)
    stream = StreamedLayers(stack, "cpu", keep_slots=False).attach()
    got = x
    for layer in stack:  # a loop the stream does not own: the hooks move the layers
        got = layer(got)
    assert torch.equal(got, want) and stream._slots == [None, None]
    stream.detach()


def test_a_placement_streams_only_what_its_tier_offloads():
    toy = _toy()
    assert placement_for(toy, "none").offloaded == frozenset()
    assert placement_for(toy, "model").offloaded == {"text_encoder", "vae"}
    assert placement_for(toy, "block").offloaded == {"dit", "text_encoder", "vae"}
    placement = Placement("block", {"dit": 3, "text_encoder": 0, "vae": 0}, frozenset({"dit"}))
    assert placement.resident_layers("dit") == 3 and placement.resident_layers("text_encoder") is None


def test_keyframes_and_references_add_their_rows_to_the_minimax_plan():
    from telefuser.pipelines.minimax_h3.memory import condition_rows
    from telefuser.pipelines.minimax_h3.shapes import plan_shape

    config = _minimax_config("official")
    shape = plan_shape(duration_s=5, resolution="768", aspect_ratio="16:9")
    frame = (shape.latent_h // 2) * (shape.latent_w // 2)  # one latent frame: 48 x 84 latents, 24 x 42 rows
    assert condition_rows(shape, config, 2, ()) == 2 * frame == 2 * 24 * 42
    # a 16:9 image reference at the 2048-pixel short edge: 3648 x 2048 pixels, 228 x 128 latents, 114 x 64 rows
    assert condition_rows(shape, config, 0, [("image", (1920, 1080))]) == 114 * 64
    assert condition_rows(shape, config, 0, ["audio"]) == shape.audio_tokens
    args = _minimax_args(config="official")
    plain, keyed = (
        workload_of(args, {"duration": 5, "resolution": "768", "steps": 9, **extra}) for extra in ({}, {"keyframes": 2})
    )
    assert plain.stages[2].transient["activations"] < keyed.stages[2].transient["activations"]


def _minimax_config(size: str):
    from telefuser.models.minimax_h3 import MiniMaxH3Config

    return MiniMaxH3Config.tiny() if size == "tiny" else MiniMaxH3Config()


def workload_of(args, request):
    from telefuser.pipelines.minimax_h3.memory import workload

    return workload(args, ParallelConfig(), torch.bfloat16, request)
