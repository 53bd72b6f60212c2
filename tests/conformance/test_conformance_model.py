"""Every model's DiT on one process: the spec's declared parts, the FLOP count, FP8 linears, the checkpoint round
trip. Each case runs every registered model and the stand-in at the spec's tiny size (tests/conformance/specs.py).

* The DiT meets `models.protocols.DiT`; every named size builds a config whose head count the Ulysses degrees 2 and
  4 divide.
* `forward_flops` counts exactly what torch's FlopCounterMode counts on the example forward (integers of the same
  GEMMs and attention products: equal, no tolerance).
* FP8: `quantize("fp8")` turns exactly each block's `FP8_LINEARS` into `Float8Linear`s and nothing else. The forward
  then stays within 10% (max relative) of the dense one: e4m3 rounds each weight and activation by up to 2^-4 (6.25%)
  of itself, 3.6% relative L2 per GEMM (tests/unit/test_fp8.py), and the GEMMs' errors partly cancel through norms
  and residuals. Measured: 1.2% (LingBot) to 2.3% (Wan 2.2), 5.4% for the stand-in, whose head reads its residual
  stream without a norm; the bound is 1.6 rounding steps. The negative control, other weights, lands above 0.5.
* Checkpoint: a bf16 random model written in its release layout by the spec's writer and read by the spec's loader
  comes back bit for bit, dtypes included (data movement: exact). The negative control, another seed, differs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from telefuser.distributed.mesh import ParallelConfig
from telefuser.models.protocols import DiT
from telefuser.models.registry import MODELS
from telefuser.ops.fp8 import Float8Linear
from telefuser.profiling.flop_rates import flop_counter
from tests.conformance.specs import each_model, spec_named, tiny
from tests.numerics import relative_error

FP8_BOUND = 0.1
OTHER_WEIGHTS = 0.5


@pytest.mark.parametrize("name", list(MODELS))
def test_every_registered_model_declares_its_dit_parts(name):
    spec = MODELS[name]
    assert spec.sizes[0] == "tiny" and "official" in spec.sizes
    assert None not in (spec.example, spec.flops, spec.checkpoint_writer)
    assert {"random", "checkpoint"} <= set(spec.loaders) and "fp8" in spec.quantizations


@each_model()
def test_the_dit_meets_the_protocol_and_every_size_splits_over_ulysses(name):
    spec = spec_named(name)
    model = tiny(name)
    assert isinstance(model, DiT) and model.config == spec.config_of("tiny")
    for size in spec.sizes:
        heads = spec.num_heads(spec.config_of(size))
        assert spec.num_layers(spec.config_of(size, layers=1)) == 1  # a size's width at a few layers, for benches
        for degree in (2, 4):
            ParallelConfig(ulysses_degree=degree).check_heads(heads)
    with pytest.raises(ValueError, match=f"{name} has no DiT size 'huge'"):
        spec.config_of("huge")


@each_model()
def test_the_flop_count_is_what_the_counter_counts(name):
    """At the example's defaults and at the tiny shape the tools run (a KV window read after it rolled, say)."""
    spec = spec_named(name)
    model = tiny(name)
    for shape in ({}, spec.example_shape("tiny")):
        example = spec.example_forward(model, **shape)
        with flop_counter() as counter:
            example.run()
        assert spec.forward_flops(model.config, **example.shape) == counter.get_total_flops(), shape


@pytest.mark.numerics
@each_model()
def test_fp8_turns_exactly_the_declared_block_linears_and_stays_close(name):
    spec = spec_named(name)
    assert "fp8" in spec.quantizations
    dense, model = tiny(name), tiny(name)
    names = model.quantize("fp8")
    expected = {f"blocks.{i}.{linear}" for i in range(len(model.blocks)) for linear in model.FP8_LINEARS}
    assert len(names) == len(expected) and set(names) == expected
    fp8 = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert fp8 == expected and "fp8" in model.weights_source
    assert all(isinstance(m, nn.Linear) for n, m in dense.named_modules() if n in expected)
    assert model.quantize("none") == []
    with pytest.raises(ValueError, match="'none' or 'fp8'"):
        model.quantize("int4")

    reference = spec.example_forward(dense).run()
    got = spec.example_forward(model).run()
    other = spec.example_forward(tiny(name, seed=1)).run()
    errors = [relative_error(g, r) for g, r in zip(got, reference, strict=True)]
    print(f"{name}: fp8 against dense, max rel {max(errors):.2e}")
    assert max(errors) <= FP8_BOUND, errors
    assert min(relative_error(o, r) for o, r in zip(other, reference, strict=True)) > OTHER_WEIGHTS


@each_model()
def test_a_checkpoint_written_in_the_release_layout_reads_back_bit_for_bit(name, tmp_path):
    spec = spec_named(name)
    source = tiny(name, seed=5, dtype=torch.bfloat16)
    path = spec.write_checkpoint(source, tmp_path)
    loaded = spec.loader("checkpoint")(path, device="cpu", dtype=torch.bfloat16)
    assert loaded.weights_source.startswith("checkpoint")
    expected, state = source.state_dict(), loaded.state_dict()
    assert list(state) == list(expected)
    for key, value in expected.items():
        assert state[key].dtype == value.dtype and torch.equal(state[key], value), key
    other = dict(tiny(name, seed=6, dtype=torch.bfloat16).named_parameters())
    assert not any(torch.equal(other[key], value) for key, value in source.named_parameters())
