"""FP8 GEMMs (ops.fp8) on CPU: the quantization error bound, a linear against its full-precision original, the FP8
bench. torch._scaled_mm runs on CPU too, so the arithmetic is checked here; the speed is a GPU matter (tools/bench,
docs/perf). Each model's FP8 plan (exactly its block linears, a forward within bound) is the conformance suite's
(tests/conformance/test_conformance_model.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from telefuser.models import registry
from telefuser.ops.fp8 import FP8_MAX, Float8Linear, linear_dtype, quantize_linears, quantize_rows
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


def test_forward_hooks_of_a_replaced_linear_survive():
    model = nn.Sequential(nn.Linear(32, 32))
    seen = []
    model[0].register_forward_hook(lambda module, inputs, output: seen.append(output.shape))
    quantize_linears(model, lambda name, _: True)
    model(torch.randn(3, 32))
    assert isinstance(model[0], Float8Linear) and seen == [torch.Size([3, 32])]  # e.g. a TP split's all-reduce


# Every registered model has FP8 linears, so the bench takes each; the modes alternate over them (each mode on two).
@pytest.mark.parametrize(
    "model,mode", [(name, ("sequential", "alternating")[i % 2]) for i, name in enumerate(registry.names())]
)
def test_the_fp8_bench_runs_both_variants_of_every_model_and_reports_the_gate(model, mode, tmp_path, capsys):
    import json

    bench = load_script("tools/bench/fp8_dit_bench.py")
    out = tmp_path / "fp8.json"
    args = ["--model", model, "--config", "tiny", "--device", "cpu", "--iters", "1", "--output", str(out)]
    assert bench.main(args + (["--sequential"] if mode == "sequential" else [])) == 0
    report = json.loads(out.read_text())
    assert report["mode"] == mode
    assert set(report["median_s"]) == {"bf16", "fp8"} and report["gate_passed"] and report["cosine"] > 0.99
    assert 0 < report["relative_l2"] < 0.1  # e4m3 rounding, not a broken model (conformance: within 10%)
    assert "| fp8 |" in capsys.readouterr().out


def test_the_fp8_bench_fails_its_gate_when_fp8_cannot_meet_it(tmp_path):
    import json

    bench = load_script("tools/bench/fp8_dit_bench.py")
    out = tmp_path / "fp8.json"
    args = ["--model", "wan2.2-ti2v-5b", "--config", "tiny", "--device", "cpu", "--iters", "1", "--output", str(out)]
    assert bench.main(args + ["--min-cosine", "1.0"]) == 1  # FP8 rounds: never bit-identical to bf16
    assert not json.loads(out.read_text())["gate_passed"]


def test_the_fp8_bench_takes_every_registered_model_by_its_registry_name(capsys):
    bench = load_script("tools/bench/fp8_dit_bench.py")
    assert bench.fp8_models() == registry.names()
    for refused in (["--model", "minimax"], ["--model", "wan2.2-ti2v-5b", "--config", "huge"]):
        with pytest.raises(SystemExit):
            bench.parse_args(refused)
    assert "wan2.2-ti2v-5b has the sizes tiny, official" in capsys.readouterr().err


def test_the_fp8_bench_refuses_fp8_attention_without_a_hopper_gpu_before_building(monkeypatch):
    bench = load_script("tools/bench/fp8_dit_bench.py")
    monkeypatch.setattr(bench, "build_model", lambda *a: pytest.fail("the model was built before the check"))
    with pytest.raises(SystemExit, match="fp8_dit_bench: attention implementation 'cudnn_fp8' was asked for but"):
        bench.main(["--model", "minimax_h3", "--config", "tiny", "--device", "cpu", "--fp8-attention"])


def test_the_fp8_bench_variants_option_picks_a_subset_in_a_fixed_order():
    bench = load_script("tools/bench/fp8_dit_bench.py")
    assert bench.parse_args(["--model", "minimax_h3"]).variants == ["bf16", "fp8"]
    args = bench.parse_args(["--model", "minimax_h3", "--fp8-attention"])
    assert args.variants == ["bf16", "bf16+fp8-attn", "fp8", "fp8+fp8-attn"]
    assert bench.parse_args(["--model", "minimax_h3", "--fp8-attention", "--sage"]).variants == list(bench.VARIANTS)
    args = bench.parse_args(["--model", "minimax_h3", "--variants", "fp8+sage,bf16+fp8-attn"])
    assert args.variants == ["bf16", "bf16+fp8-attn", "fp8+sage"]  # the reference always runs; VARIANTS' order
    assert [bench.attention_of(v) for v in args.variants] == ["sdpa", "cudnn_fp8", "sage_sm90"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", "minimax_h3", "--variants", "int4"])
