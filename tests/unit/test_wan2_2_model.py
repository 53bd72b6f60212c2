"""Wan 2.2's DiT against diffusers' `WanTransformer3DModel` on tiny random configs (both variants' channel counts),
read from diffusers' layout, with one timestep per sample and with one per token (diffusers' ``timestep`` of shape
(batch, seq_len), TI2V-5B's image condition); the expert folders of both layouts; the spec in the registry. The
original layout's round trip, the seeded random build, FP8, compiled regions and Ulysses are the conformance suite's
(tests/conformance); Ulysses with per-token timesteps is tests/distributed/test_wan2_2_parity.py's.

Tolerance: both models run in fp32 and compute the same function in another order; ours takes the timestep sinusoid
and the RoPE angles in float64 (as the release), diffusers the sinusoid in float32 (angles t * f up to 1000 rad, so
up to ~6e-5 rad of rounding on its lowest frequencies). Measured 1.3e-6 to 3.0e-6 (per-token timesteps alike: ours
embeds each distinct timestep once, diffusers every token, the same arithmetic per value); the bound is the repo's
1024 fp32 unit roundoffs (6.1e-5), and a convention error must land 800x above it: RoPE on halves instead of adjacent
pairs, and for per-token timesteps the t = 0 frame shifted by one, or the sample's t given to every token (0.48).
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

from telefuser.models import registry
from telefuser.models.wan import attention as wan_attention
from telefuser.models.wan2_2.checkpoint import (
    CheckpointError,
    boundary_ratio,
    build_random_wan22_dit,
    expert_dirs,
    load_wan22_dit,
)
from telefuser.models.wan2_2.config import Wan22Config
from telefuser.ops.compile_stats import count_compiled
from telefuser.ops.regions import compile_regions_on
from tests.numerics import UNIT_ROUNDOFF, relative_error

pytestmark = pytest.mark.numerics

BOUND = 1024 * UNIT_ROUNDOFF[torch.float32]
FAR = 800 * BOUND  # where a convention error must land
TEXT_LEN = 16


def diffusers_dit(in_channels: int, seed: int) -> WanTransformer3DModel:
    """diffusers' Wan transformer at the tiny config's sizes, every parameter perturbed off its init (norm scales
    of one, zero biases and tables would hide a swapped or missed tensor)."""
    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=in_channels,
        out_channels=in_channels,
        text_dim=32,
        freq_dim=32,
        ffn_dim=128,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
    ).eval()
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    return model


def inputs(in_channels: int):
    """CFG's batch of two (cond, uncond) at different timesteps; prompts of 7 and 5 rows, zero-padded."""
    g = torch.Generator().manual_seed(7)
    latents = torch.randn(2, in_channels, 3, 4, 6, generator=g)  # 3 frames of 2 x 3 tokens
    t = torch.tensor([937.0, 312.0])
    text = torch.randn(2, TEXT_LEN, 32, generator=g)
    text[0, 7:], text[1, 5:] = 0, 0
    return latents, t, text


def reference_flow(model, latents, t, text):
    with torch.no_grad():
        return model(hidden_states=latents, timestep=t, encoder_hidden_states=text, return_dict=False)[0]


def our_flow(model, latents, t, text):
    return model(latents, t, model.text_kv(text))


def write_diffusers(model: WanTransformer3DModel, folder):
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_len"] = TEXT_LEN  # the release attends 512 rows; the tiny prompt has 16
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("in_channels", [16, 48], ids=["t2v-a14b", "ti2v-5b"])
def test_one_forward_matches_diffusers_in_either_layout(in_channels, tmp_path):
    reference = diffusers_dit(in_channels, seed=0)
    latents, t, text = inputs(in_channels)
    expected = reference_flow(reference, latents, t, text)

    ours = load_wan22_dit(write_diffusers(reference, tmp_path / "diffusers"), device="cpu", dtype=torch.float32)
    assert (ours.config.in_dim, ours.config.dim, ours.config.text_len) == (in_channels, 64, TEXT_LEN)
    error = relative_error(our_flow(ours, latents, t, text), expected)
    print(f"Wan 2.2 DiT (in {in_channels}) against diffusers: max rel {error:.2e}")
    assert error <= BOUND


def test_a_rope_convention_error_lands_far_above_the_bound(monkeypatch, tmp_path):
    """Negative control: the same model with RoPE rotating halves instead of Wan's adjacent pairs."""
    reference = diffusers_dit(16, seed=0)
    latents, t, text = inputs(16)
    ours = load_wan22_dit(write_diffusers(reference, tmp_path), device="cpu", dtype=torch.float32)

    def rotate_halves(x, cos, sin):
        first, second = x.float().chunk(2, dim=-1)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)

    monkeypatch.setattr(wan_attention, "apply_rope", rotate_halves)
    error = relative_error(our_flow(ours, latents, t, text), reference_flow(reference, latents, t, text))
    print(f"negative control (RoPE on halves): max rel {error:.2e}")
    assert error > FAR


# -- per-token timesteps (TI2V-5B's image condition) ---------------------------------------------------------------
GRID = (3, 2, 3)  # the tokens of `inputs`' latents: 3 frames of 2 x 3
SAMPLE_T = torch.tensor([937.0, 312.0])  # the CFG pair's own timesteps, as in `inputs`


def frame_timesteps(zero_frame: int = 0) -> torch.Tensor:
    """``[2, 18]``: each sample's t on every token but those of latent frame `zero_frame`, which run at 0 (the image
    condition's pattern, diffusers' ``mask[0][0][:, ::2, ::2] * t`` flattened)."""
    mask = torch.ones(GRID)
    mask[zero_frame] = 0
    return mask.flatten()[None] * SAMPLE_T[:, None]


def random_timesteps() -> torch.Tensor:
    """``[2, 18]``: a different timestep on every token (the general (batch, seq_len) case)."""
    return torch.rand(2, GRID[0] * GRID[1] * GRID[2], generator=torch.Generator().manual_seed(5)) * 1000.0


@pytest.fixture(scope="module")
def ti2v_pair(tmp_path_factory):
    """diffusers' DiT at TI2V-5B's 48 channels and ours read from its folder."""
    reference = diffusers_dit(48, seed=0)
    folder = write_diffusers(reference, tmp_path_factory.mktemp("ti2v"))
    return reference, load_wan22_dit(folder, device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("timesteps", [frame_timesteps, random_timesteps], ids=["first-frame-at-0", "every-token"])
def test_per_token_timesteps_match_diffusers(ti2v_pair, timesteps):
    reference, ours = ti2v_pair
    latents, _, text = inputs(48)
    t = timesteps()
    error = relative_error(our_flow(ours, latents, t, text), reference_flow(reference, latents, t, text))
    print(f"Wan 2.2 DiT, per-token timesteps ({timesteps.__name__}) against diffusers: max rel {error:.2e}")
    assert error <= BOUND


@pytest.mark.parametrize("wrong", ["frame shifted by one", "the sample's t on every token"])
def test_misplaced_per_token_timesteps_land_far_above_the_bound(ti2v_pair, wrong):
    """Negative controls: the t = 0 tokens one latent frame late, or no per-token timestep at all."""
    reference, ours = ti2v_pair
    latents, _, text = inputs(48)
    expected = reference_flow(reference, latents, frame_timesteps(), text)
    t = frame_timesteps(zero_frame=1) if wrong == "frame shifted by one" else SAMPLE_T
    error = relative_error(our_flow(ours, latents, t, text), expected)
    print(f"negative control ({wrong}): max rel {error:.2e}")
    assert error > FAR


def test_one_timestep_on_every_token_is_the_per_sample_forward_exactly(ti2v_pair):
    """Each sample's t repeated on its tokens embeds the same distinct values in the same order (ascending, as
    `torch.unique` sorts them) through the same GEMMs, then copies each row its entry: the per-sample forward's bits."""
    _, ours = ti2v_pair
    latents, _, text = inputs(48)
    ascending = torch.tensor([312.0, 937.0])
    per_token = ascending[:, None].expand(2, GRID[0] * GRID[1] * GRID[2])
    assert torch.equal(our_flow(ours, latents, per_token, text), our_flow(ours, latents, ascending, text))


def test_per_token_timesteps_trace_into_the_compiled_block_region(ti2v_pair):
    """The per-token modulation (a table and row indices) passes through the block region whole-graph (aot_eager on
    the CPU: the tracing, without code generation); fp32, the same ops: within the bound of the eager forward."""
    _, ours = ti2v_pair
    latents, _, text = inputs(48)
    t = frame_timesteps()
    eager = our_flow(ours, latents, t, text)
    try:
        with compile_regions_on("cpu", backend="aot_eager"), count_compiled() as stats:
            compiled = our_flow(ours, latents, t, text)
    finally:
        torch._dynamo.reset()
    assert stats.calls == len(ours.blocks), stats  # one compiled region call per block
    assert relative_error(compiled, eager) <= BOUND


@pytest.mark.parametrize(
    ("t", "message"),
    [
        (torch.full((2, 17), 500.0), r"t must be \[B=2\] or per token \[B=2, N=18\], got \(2, 17\)"),
        (torch.full((1, 18), 500.0), r"t must be \[B=2\] or per token \[B=2, N=18\], got \(1, 18\)"),
        (frame_timesteps() * 2.0, r"t must lie in \[0, 1000\], got values from 0 to 1874"),
    ],
    ids=["tokens", "batch", "range"],
)
def test_bad_per_token_timesteps_are_refused_by_name(ti2v_pair, t, message):
    _, ours = ti2v_pair
    latents, _, text = inputs(48)
    with pytest.raises(ValueError, match=message):
        our_flow(ours, latents, t, text)


def test_the_experts_are_found_in_both_layouts_and_a_missing_one_is_named(tmp_path):
    dit = build_random_wan22_dit(Wan22Config.tiny(), seed=0)
    tensors = {k: v.contiguous() for k, v in dit.state_dict().items()}
    original, diffusers = tmp_path / "original", tmp_path / "diffusers"
    for folder in (original / "high_noise_model", original / "low_noise_model", diffusers / "transformer"):
        folder.mkdir(parents=True)
        save_file(tensors, folder / "diffusion_pytorch_model.safetensors")
    (diffusers / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "boundary_ratio": 0.875}))
    assert [d.name for d in expert_dirs(original, 2)] == ["high_noise_model", "low_noise_model"]
    assert boundary_ratio(original) is None and boundary_ratio(diffusers) == 0.875
    with pytest.raises(CheckpointError, match=r"diffusers layout\) lacks Wan 2.2 DiT weights .*transformer_2"):
        expert_dirs(diffusers, 2)
    assert [d.name for d in expert_dirs(diffusers, 1)] == ["transformer"]


def test_a_wan_2_1_image_branch_is_refused_by_name(tmp_path):
    dit = build_random_wan22_dit(Wan22Config.tiny(), seed=0)
    tensors = {k: v.contiguous() for k, v in dit.state_dict().items()}
    tensors["img_emb.proj.1.weight"] = torch.zeros(4, 4)
    save_file(tensors, tmp_path / "diffusion_pytorch_model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(dit.config.to_dict()))
    with pytest.raises(CheckpointError, match=r"has a CLIP image branch \(img_emb.proj.1.weight\)"):
        load_wan22_dit(tmp_path, device="cpu")


def test_random_weights_say_so_and_the_specs_are_registered(caplog):
    with caplog.at_level(logging.WARNING, logger="telefuser.models.wan2_2.checkpoint"):
        build_random_wan22_dit(Wan22Config.tiny(), seed=3)
    assert "random weights (no checkpoint), seed 3 -- outputs are meaningless" in caplog.text
    for name in ("wan2.2-t2v-a14b", "wan2.2-ti2v-5b"):
        spec = registry.get_spec(name)
        assert spec.model_class == "telefuser.models.wan2_2.dit:Wan22DiT" and spec.loader("random") is not None
