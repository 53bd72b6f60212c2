"""FP8 GEMMs (ops.fp8) on CPU: the quantization error bound, a linear against its full-precision original, the
LingBot plan. torch._scaled_mm runs on CPU too, so the arithmetic is checked here; the speed is a GPU matter
(tools/bench, docs/perf)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit
from telefuser.ops.fp8 import FP8_MAX, Float8Linear, linear_dtype, quantize_linears, quantize_rows
from tests.numerics import relative_error
from tests.tool_scripts import load_script

# e4m3 rounds a normal value by at most 2^-4 of itself (3 mantissa bits) and a subnormal by at most half its spacing,
# 2^-10 of the scale (the smallest e4m3 subnormal is 2^-9 of the scale's unit).
NORMAL_ROUNDING, SUBNORMAL_STEP = 2.0**-4, 2.0**-10


def test_rows_dequantize_within_e4m3_rounding():
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 64)[:, None]
    values, scale = quantize_rows(x)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (64, 1) and scale.dtype == torch.float32
    assert torch.allclose(values.float().abs().amax(dim=1), torch.full((64,), FP8_MAX))  # each row's max is e4m3's
    error = (values.float() * scale - x).abs()
    assert (error <= NORMAL_ROUNDING * x.abs() + SUBNORMAL_STEP * scale).all()


# Random data: 3.6% relative L2 measured (fp32 and bf16 inputs) against the unquantized linear, cosine 0.9994. The
# bounds leave room for other seeds and shapes; a wrong weight (the negative control) lands near 1.4, 28x above.
REL_L2_BOUND, COSINE_BOUND = 0.05, 0.998


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fp8_linear_tracks_the_original(dtype):
    g = torch.Generator().manual_seed(1)
    linear = nn.Linear(256, 128).to(dtype)
    x = torch.randn(3, 10, 256, generator=g).to(dtype)
    quantized = Float8Linear(linear)
    got, expected = quantized(x), linear(x)
    assert got.shape == expected.shape and got.dtype == dtype and linear_dtype(quantized) == dtype
    assert _rel_l2(got, expected) <= REL_L2_BOUND
    cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
    assert cosine >= COSINE_BOUND
    other = Float8Linear(nn.Linear(256, 128).to(dtype))
    assert _rel_l2(other(x), expected) > 20 * REL_L2_BOUND


def test_shapes_an_fp8_gemm_cannot_take_are_refused_by_name():
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 24))
    with pytest.raises(ValueError, match=r"1: FP8 GEMMs need both dimensions divisible by 16, got 24x32"):
        quantize_linears(model, lambda name, _: True)


@pytest.mark.numerics
def test_lingbot_fp8_quantizes_the_block_gemms_only_and_stays_close():
    config = LingBotWorldV2Config.tiny()
    model = build_random_lingbot_dit(config, seed=0)
    reference = build_random_lingbot_dit(config, seed=0)
    names = model.quantize("fp8")
    assert len(names) == config.num_layers * len(model.FP8_LINEARS)
    assert all(isinstance(model.get_submodule(n), Float8Linear) for n in names)
    kept = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert all(
        "cam" in n or "modulation" in n or not n.startswith("blocks.") or "cross_attn.k" in n or "cross_attn.v" in n
        for n in kept
    ), kept
    assert model.compute_dtype == reference.compute_dtype and "fp8" in model.weights_source
    g = torch.Generator().manual_seed(2)
    text = torch.randn(1, 5, config.text_dim, generator=g)
    latents = torch.randn(1, config.in_dim, 2, 4, 6, generator=g)
    camera = torch.randn(1, 12, config.camera_feature_dim, generator=g)

    def run(m):
        session = m.new_session(1, text, tokens_per_frame=6)
        return m.forward_chunk(session, latents, torch.tensor([500.0]), camera, update_cache=False)

    expected = run(reference)
    # Two blocks of 3.6%-per-GEMM noise partly cancel through the norms and the residual stream: 1.0% measured (max
    # relative); the bound is 5x that, and other weights (the negative control) land near 1.4, 27x above it.
    assert relative_error(run(model), expected) <= 0.05
    assert relative_error(run(build_random_lingbot_dit(config, seed=1)), expected) > 0.5
    assert model.quantize("none") == []
    with pytest.raises(ValueError, match="'none' or 'fp8'"):
        model.quantize("int4")


def test_forward_hooks_of_a_replaced_linear_survive():
    model = nn.Sequential(nn.Linear(32, 32))
    seen = []
    model[0].register_forward_hook(lambda module, inputs, output: seen.append(output.shape))
    quantize_linears(model, lambda name, _: True)
    model(torch.randn(3, 32))
    assert isinstance(model[0], Float8Linear) and seen == [torch.Size([3, 32])]  # e.g. a TP split's all-reduce


@pytest.mark.numerics
def test_minimax_fp8_quantizes_the_joint_blocks_gemms_and_stays_close():
    from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit

    config = MiniMaxH3Config.tiny()
    model, reference = build_random_minimax_h3_dit(config, seed=0), build_random_minimax_h3_dit(config, seed=0)
    names = model.quantize("fp8")
    assert len(names) == config.num_layers * len(model.FP8_LINEARS) and "fp8" in model.weights_source
    g = torch.Generator().manual_seed(3)
    inputs = (
        torch.randn(1, config.latents_dim, 3, 4, 6, generator=g),
        torch.randn(1, config.audio_latents_dim, 8, generator=g),
        torch.randn(1, 3, config.text_dim, generator=g),
        torch.tensor([400.0]),
        torch.tensor([700.0]),
    )
    with torch.no_grad():
        expected, got = reference(*inputs), model(*inputs)
        other = build_random_minimax_h3_dit(config, seed=1)(*inputs)
    # measured 1.8% (video) and 1.4% (audio) max relative; the bound is 5%; other weights land at 1.1 to 1.5
    for modality in range(2):  # video, audio
        assert relative_error(got[modality], expected[modality]) <= 0.05
        assert relative_error(other[modality], expected[modality]) > 0.5  # the negative control: other weights


@pytest.mark.parametrize("model,mode", [("minimax", "sequential"), ("lingbot", "alternating")])
def test_the_fp8_bench_runs_both_variants_and_reports_the_gate(model, mode, tmp_path, capsys):
    import json

    bench = load_script("tools/bench/fp8_dit_bench.py")
    out = tmp_path / "fp8.json"
    assert (
        bench.main(
            ["--model", model, "--config", "tiny", "--device", "cpu", "--iters", "1", "--output", str(out)]
            + (["--sequential"] if mode == "sequential" else [])
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["mode"] == mode
    assert set(report["median_s"]) == {"bf16", "fp8"} and report["gate_passed"] and report["cosine"] > 0.99
    assert "| fp8 |" in capsys.readouterr().out


def test_the_fp8_bench_refuses_fp8_attention_without_a_hopper_gpu_before_building(monkeypatch):
    bench = load_script("tools/bench/fp8_dit_bench.py")
    monkeypatch.setattr(bench, "minimax_call", lambda *a: pytest.fail("the model was built before the check"))
    with pytest.raises(RuntimeError, match="cudnn_fp8"):
        bench.main(["--model", "minimax", "--config", "tiny", "--device", "cpu", "--fp8-attention"])


def test_the_fp8_bench_variants_option_picks_a_subset_in_a_fixed_order():
    bench = load_script("tools/bench/fp8_dit_bench.py")
    assert bench.parse_args(["--model", "minimax"]).variants == ["bf16", "fp8"]
    args = bench.parse_args(["--model", "minimax", "--fp8-attention"])
    assert args.variants == ["bf16", "bf16+fp8-attn", "fp8", "fp8+fp8-attn"]
    assert bench.parse_args(["--model", "minimax", "--fp8-attention", "--sage"]).variants == list(bench.VARIANTS)
    args = bench.parse_args(["--model", "minimax", "--variants", "fp8+sage,bf16+fp8-attn"])
    assert args.variants == ["bf16", "bf16+fp8-attn", "fp8+sage"]  # the reference always runs; VARIANTS' order
    assert [bench.attention_of(v) for v in args.variants] == ["sdpa", "cudnn_fp8", "sage_sm90"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", "minimax", "--variants", "int4"])
