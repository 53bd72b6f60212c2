"""Every model's blocks as compiled regions against the same forward run as it is, compiled on the CPU on purpose
(Inductor's C++ backend), at the tiny size on the example inputs (tests/conformance/specs.py).

Each block must run as one compiled region call, and the outputs agree within 1e-5 (max relative). Why: in fp32,
Inductor fuses each elementwise chain keeping its intermediates in fp32 as the eager code does, but reduces (layer
and RMS norms, softmax) in another order: a few ulps (6e-8 each) per element through two blocks and the head.
Measured 1.6e-7 (LingBot) to 3.2e-7 (the stand-in), so the bound is about 30x the worst. The negative control: the
last block's parameters scaled by 1.01 (one block's weights 1% off), run eagerly, must land 100x above the bound
(measured 7.9e-3 to 1.5e-2).

CPU compile time: each model's block compiles in 2 to 15 s on 2 cores (the tiny size keeps it there); compiled code is
dropped after each case.
"""

from __future__ import annotations

import copy

import pytest
import torch

from telefuser.ops.compile_stats import count_compiled
from telefuser.ops.regions import compile_regions_on
from tests.conformance.specs import each_model, spec_named, tiny
from tests.numerics import relative_error

pytestmark = pytest.mark.numerics

BOUND = 1e-5
PERTURBATION = 1.01


@pytest.fixture(autouse=True)
def scalar_code_under_portable_kernels():
    """Under ATEN_CPU_CAPABILITY=default (the numerics pass) ATen's vector headers compile to nothing, so Inductor's
    vectorized C++ does not build: generate scalar code there."""
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        yield
        return
    with torch._inductor.config.patch({"cpp.simdlen": 1}):
        yield


@pytest.fixture(autouse=True)
def fresh_compiled_code_after():
    """Drop the compiled regions afterwards: tests that count compilations (test_compiled_regions.py) expect a
    process in which their shapes were never compiled."""
    yield
    torch._dynamo.reset()


def _max_error(outputs, references) -> float:
    return max(relative_error(o, r) for o, r in zip(outputs, references, strict=True))


@each_model()
def test_compiled_blocks_match_the_forward_run_as_it_is(name):
    spec = spec_named(name)
    model = tiny(name)
    example = spec.example_forward(model)
    eager = example.run()
    with compile_regions_on("cpu"), count_compiled() as stats:
        compiled = example.run()
    assert stats.calls == len(model.blocks), stats  # one compiled region call per block
    error = _max_error(compiled, eager)
    print(f"{name}: compiled regions against eager, max rel {error:.2e} ({stats})")
    assert error <= BOUND, error

    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        for param in perturbed.blocks[-1].parameters():
            param.mul_(PERTURBATION)
    wrong = _max_error(compiled, spec.example_forward(perturbed).run())
    print(f"{name}: negative control (last block 1% off), max rel {wrong:.2e}")
    assert wrong > 100 * BOUND, wrong
