"""Wan 2.2's memory plan: its weight terms against the built modules (exact), the tier choice on scaled budgets, and
the model tier (T2V-A14B's idle expert in host memory, umT5 streamed) and the block tier (the experts' blocks streamed
from host memory as they compute) against everything resident (exact: the same kernels on the same values)."""

from __future__ import annotations

import argparse

import pytest
import torch

from telefuser.distributed.mesh import ParallelConfig
from telefuser.memory.host import HostResident, layer_tensors
from telefuser.memory.plan import GIB, MemoryPlan, MemoryPlanError, Placement, choose, placement_for
from telefuser.pipelines.wan2_2 import loading
from telefuser.pipelines.wan2_2.loading import build_wan22_pipeline
from telefuser.runtime import Runtime

TINY_REQUEST = {"size": "64x32", "num_frames": 9}  # the tiny T2V-A14B release's canvas


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"config": "tiny", "checkpoint": None, "quantization": "none", **kw})


def _tiny(variant: str, **kw):
    return loading.workload(variant, _args(**kw), ParallelConfig(), torch.float32, TINY_REQUEST)


@pytest.fixture(scope="module")
def a14b():
    return build_wan22_pipeline(variant="t2v-a14b", config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))


@pytest.mark.parametrize("quantization", ["none", "fp8"])
def test_stacks_add_up_to_the_built_pipeline(quantization, a14b):
    if quantization == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    load = _tiny("t2v-a14b", quantization=quantization)
    pipe = a14b
    if quantization == "fp8":
        pipe = build_wan22_pipeline(
            variant="t2v-a14b", config="tiny", runtime=Runtime.one_rank("cpu", torch.float32), quantization="fp8"
        )
    assert load.stack("high_noise").total == _bytes(layer_tensors(pipe.experts[0])) > 0
    assert load.stack("low_noise").total == _bytes(layer_tensors(pipe.experts[1]))
    expert = load.stack("high_noise")  # what the block tier streams: one block's bytes, as many as there are blocks
    assert expert.count == len(pipe.experts[0].blocks)
    assert expert.layer == _bytes(layer_tensors(pipe.experts[0].blocks[0]))
    assert load.stack("text_encoder").total == _bytes(pipe.prompt_encoder.encoder.parameters())
    assert load.stack("vae").total == _bytes(layer_tensors(pipe.vae.model))


def test_ti2v_5b_stacks_add_up_to_the_built_pipeline():
    pipe = build_wan22_pipeline(variant="ti2v-5b", config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))
    load = loading.workload("ti2v-5b", _args(), ParallelConfig(), torch.float32, {"size": "128x64", "num_frames": 9})
    assert [s.name for s in load.stacks] == ["dit", "text_encoder", "vae"]
    assert load.stack("dit").total == _bytes(layer_tensors(pipe.experts[0])) > 0
    assert load.stack("dit").count == len(pipe.experts[0].blocks)
    assert load.stack("vae").total == _bytes(layer_tensors(pipe.vae.model))


def test_the_plan_keeps_one_expert_on_the_device_when_both_do_not_fit():
    load = _tiny("t2v-a14b")
    none = MemoryPlan(load, placement_for(load, "none"), None, "").peak_bytes
    model = MemoryPlan(load, placement_for(load, "model"), None, "")
    expert = load.stack("high_noise").total
    # the model tier lends one expert at a time: the peak holds one expert, not two
    assert model.resident_bytes()["high_noise"] == model.resident_bytes()["low_noise"] == 0
    assert model.stage_bytes()["denoise high noise"] - expert == sum(load.stages[1].transient.values())
    assert choose(load, none, budget_source="x").placement.tier == "none"
    chosen = choose(load, none - expert // 2, budget_source="x")
    assert chosen.placement.tier == "model" and chosen.placement.offloaded >= {"high_noise", "low_noise"}
    # the block tier streams both experts' blocks (two slots each while its steps run), their fixed parts resident
    block = MemoryPlan(load, placement_for(load, "block"), None, "")
    slots = 2 * load.stack("high_noise").layer
    assert block.resident_bytes()["high_noise"] == load.stack("high_noise").fixed
    assert block.stage_bytes()["denoise high noise"] - slots == sum(load.stages[1].transient.values())
    assert block.host_bytes - model.host_bytes == -2 * load.stack("high_noise").fixed
    alternatives = loading.alternatives("t2v-a14b", _args(), ParallelConfig(), torch.float32, TINY_REQUEST)
    with pytest.raises(MemoryPlanError) as refused:
        choose(
            load,
            min(model.peak_bytes, block.peak_bytes) - 1,
            budget_source="a card too small",
            alternatives=alternatives,
        )
    message = str(refused.value)  # tiny: activations and the decode outweigh the experts, so fewer frames fit
    assert "--offload model needs" in message and "--offload block needs" in message
    assert "--num-frames 5 --offload" in message


def test_official_a14b_needs_the_model_tier_on_an_80_gb_card():
    """One expert is 27.0 GiB in bf16 (measured); both and umT5 resident do not fit 72 GiB at 720p."""
    load = loading.workload(
        "t2v-a14b", _args(config="official"), ParallelConfig(), torch.bfloat16, {"size": "1280x720", "num_frames": 81}
    )
    assert 26.9 < load.stack("high_noise").total / GIB < 27.1
    tiers = {card: choose(load, int(0.9 * card * GIB)).placement.tier for card in (141, 80, 48)}
    assert tiers == {141: "none", 80: "model", 48: "model"}
    alternatives = loading.alternatives(
        "t2v-a14b", _args(config="official"), ParallelConfig(), torch.bfloat16, {"size": "1280x720", "num_frames": 81}
    )
    with pytest.raises(MemoryPlanError, match=r"what would fit: --vae-dtype bfloat16 .*; --ulysses-degree 2 "):
        choose(load, int(0.9 * 32 * GIB), alternatives=alternatives)


def test_official_a14b_at_480p_streams_blocks_on_32_and_24_gb_cards():
    """What ComfyUI users run on one 24-32 GB card: the experts' blocks stream, as many as fit stay resident."""
    load = loading.workload(
        "t2v-a14b", _args(config="official"), ParallelConfig(), torch.bfloat16, {"size": "832x480", "num_frames": 81}
    )
    for card in (32, 24):
        plan = choose(load, int(0.9 * card * GIB))
        assert plan.placement.tier == "block" and plan.peak_bytes <= 0.9 * card * GIB
        assert 0 < plan.placement.resident["high_noise"] < 40 and plan.host_bytes > 40 * GIB


def test_model_tier_equals_everything_resident_exactly(a14b, monkeypatch):
    load = _tiny("t2v-a14b")
    placement = placement_for(load, "model")
    lent = []
    on = HostResident.on

    def spy(self, device):
        lent.append(next(i for i, e in enumerate(offloaded.experts) if e is self.module))
        return on(self, device)

    offloaded = build_wan22_pipeline(
        variant="t2v-a14b", config="tiny", runtime=Runtime.one_rank("cpu", torch.float32), placement=placement
    )
    assert offloaded.prompt_encoder.stream is not None and all(h is not None for h in offloaded.homes)
    monkeypatch.setattr(HostResident, "on", spy)
    want = a14b("a red fox", negative_prompt="blur", seed=3)
    got = offloaded("a red fox", negative_prompt="blur", seed=3)
    assert lent == [0, 1]  # each expert lent once, high noise first, switched at the boundary
    assert want.latents.abs().max() > 0 and want.frames.std() > 0
    assert torch.equal(got.latents, want.latents) and (got.frames == want.frames).all()


@pytest.mark.parametrize("variant", ["t2v-a14b", "ti2v-5b"])
def test_block_tier_equals_everything_resident_exactly(variant, a14b):
    request = TINY_REQUEST if variant == "t2v-a14b" else {"size": "128x64", "num_frames": 9}
    load = loading.workload(variant, _args(), ParallelConfig(), torch.float32, request)
    placement = placement_for(load, "block")
    stacks = [s.name for s in load.stacks if s.count and s.name != "text_encoder"]
    placement = Placement("block", {**placement.resident, stacks[0]: 1}, placement.offloaded)  # one block stays
    runtime = Runtime.one_rank("cpu", torch.float32)
    resident = a14b if variant == "t2v-a14b" else build_wan22_pipeline(variant=variant, config="tiny", runtime=runtime)
    streamed = build_wan22_pipeline(variant=variant, config="tiny", runtime=runtime, placement=placement)
    assert all(h is None for h in streamed.homes) and "blocks streamed" in streamed.weights["dit"]
    width, height = (int(v) for v in request["size"].split("x"))
    want = resident("a red fox", negative_prompt="blur", seed=3, width=width, height=height)
    got = streamed("a red fox", negative_prompt="blur", seed=3, width=width, height=height)
    for expert, name in zip(streamed.experts, stacks, strict=True):
        stream = expert.block_stream
        assert stream is not None and stream.resident == placement.resident[name] and stream.bytes_copied > 0
    assert want.latents.abs().max() > 0 and want.frames.std() > 0
    assert torch.equal(got.latents, want.latents) and (got.frames == want.frames).all()


@pytest.mark.parametrize(
    ("gb", "size", "tier"), [(80, "832x480", "model"), (80, "1280x720", "model"), (48, "1280x720", "model")]
)
def test_plan_command_for_the_official_sizes(gb, size, tier, capsys):
    from telefuser.cli import main

    argv = ["plan", "--model", "wan2.2-t2v-a14b", "--config", "official", "--gpu-memory-gb", str(gb)]
    assert main([*argv, "--resolution", size]) == 0
    out = capsys.readouterr().out
    assert f"Wan 2.2 T2V-A14B {size} 81 frames" in out and "--offload block: peak" in out
    assert f"chosen: --offload {tier}:" in out and f"of {0.9 * gb:.1f} GiB" in out
    assert main([*argv, "--size", size]) == 0  # the spelling run_t2v.py and the plan's alternatives use
    assert capsys.readouterr().out == out


OFFICIAL_5B = {"size": "1280x704", "num_frames": 121}  # TI2V-5B's release canvas and length


def _official_5b(**kw):
    return loading.workload("ti2v-5b", _args(config="official", **kw), ParallelConfig(), torch.bfloat16, OFFICIAL_5B)


def _decode_bytes(load) -> int:
    (decode,) = [stage for stage in load.stages if stage.name == "decode"]
    return decode.transient["decode"]


def test_a_bfloat16_vae_halves_its_weights_and_the_decode_maps():
    """The decode term is the clip (float32 twice and uint8, whatever the VAE's dtype) plus the decoder's maps in the
    VAE's dtype: --vae-dtype bfloat16 halves the maps and every VAE tensor, nothing else."""
    full, half = _official_5b(), _official_5b(vae_dtype="bfloat16")
    clip = 121 * 1280 * 704 * 3 * (2 * 4 + 1)
    assert _decode_bytes(half) - clip == (_decode_bytes(full) - clip) // 2 > 0
    assert half.stack("vae").total * 2 == full.stack("vae").total
    assert [s.total for s in half.stacks if s.name != "vae"] == [s.total for s in full.stacks if s.name != "vae"]
    assert "bfloat16 VAE" in half.title and "VAE" not in full.title


def test_a_bfloat16_vae_adds_up_to_the_built_one():
    runtime = Runtime.one_rank("cpu", torch.float32)
    pipe = build_wan22_pipeline(variant="ti2v-5b", config="tiny", runtime=runtime, vae_dtype=torch.bfloat16)
    load = loading.workload(
        "ti2v-5b", _args(vae_dtype="bfloat16"), ParallelConfig(), torch.float32, {"size": "128x64", "num_frames": 9}
    )
    assert {t.dtype for t in layer_tensors(pipe.vae.model)} == {torch.bfloat16}
    assert load.stack("vae").total == _bytes(layer_tensors(pipe.vae.model)) > 0


def test_the_official_ti2v_5b_on_32_and_24_gb_cards_is_refused_naming_a_bfloat16_vae():
    """Its float32 decode alone is most of a 32 GB card; the refusal names the flags that fit, a bfloat16 VAE first,
    and with it the plan picks a tier on both cards."""
    for card, tier in ((32, "model"), (24, "block")):
        budget = int(0.9 * card * GIB)
        alternatives = loading.alternatives(
            "ti2v-5b", _args(config="official"), ParallelConfig(), torch.bfloat16, OFFICIAL_5B
        )
        with pytest.raises(MemoryPlanError, match="what would fit: --vae-dtype bfloat16 --offload " + tier):
            choose(_official_5b(), budget, alternatives=alternatives)
        plan = choose(_official_5b(vae_dtype="bfloat16"), budget)
        assert plan.placement.tier == tier and plan.peak_bytes <= budget
