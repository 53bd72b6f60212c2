"""Compiled elementwise chains (ops.fusion): the switch, and on a GPU, compiled against eager for each fused function
and for whole tiny models (bf16: tolerances are a few bf16 ulps of O(1) activations)."""

from __future__ import annotations

import pytest
import torch

from telefuser.models.minimax_h3 import blocks as minimax_blocks
from telefuser.models.minimax_h3 import modulation as minimax_mod
from telefuser.models.wan import blocks as wan_blocks
from telefuser.models.wan import norms as wan_norms
from telefuser.models.wan.rope import apply_rope
from telefuser.ops.fusion import cuda_fused, fusion_enabled, set_fusion

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU on this machine: compiled kernels run on CUDA only"
)


@pytest.fixture
def fusion_on():
    before = fusion_enabled()
    set_fusion(True)
    yield
    set_fusion(before)


def test_cpu_inputs_run_the_reference_without_compiling(fusion_on):
    calls = []

    @cuda_fused
    def double(x):
        calls.append(torch.compiler.is_compiling())
        return x * 2

    x = torch.arange(5.0)
    assert torch.equal(double(x), x * 2) and calls == [False]
    assert double.reference is not double


def _cases(device):
    g = torch.Generator(device="cpu").manual_seed(3)
    r = lambda *shape, dtype=torch.bfloat16: torch.randn(*shape, generator=g).to(device, dtype)  # noqa: E731
    rows = torch.randint(0, 6, (2, 300), generator=g).to(device)
    x_bf, x_fp = r(2, 300, 256), r(2, 300, 256, dtype=torch.float32)
    cos, sin = r(300, 32, dtype=torch.float32), r(300, 32, dtype=torch.float32)
    return {
        "minimax.modulate": (minimax_mod.modulate, (x_bf, r(6, 256), r(6, 256), rows)),
        "minimax.norm_modulate": (minimax_mod.norm_modulate, (x_bf, r(256) + 1, 1e-5, r(6, 256), r(6, 256), rows)),
        "minimax.gated_residual": (minimax_mod.gated_residual, (x_bf, r(6, 256), r(2, 300, 256), rows)),
        "minimax.swiglu": (minimax_blocks.swiglu, (r(2, 300, 512),)),
        "wan.wan_rms_norm": (wan_norms.wan_rms_norm, (x_bf, r(256) + 1, 1e-6)),
        "wan.layer_norm_modulate": (
            wan_norms.layer_norm_modulate,
            (x_fp, 1e-6, r(2, 1, 256, dtype=torch.float32), r(2, 1, 256, dtype=torch.float32), torch.bfloat16),
        ),
        "wan.layer_norm_to": (
            wan_norms.layer_norm_to,
            (x_fp, r(256, dtype=torch.float32), r(256, dtype=torch.float32), 1e-6, torch.bfloat16),
        ),
        "wan.apply_rope": (apply_rope, (r(2, 300, 4, 64), cos, sin)),
        "wan.gated_residual": (wan_blocks.gated_residual, (x_fp, x_bf, r(2, 1, 256, dtype=torch.float32))),
        "wan.scale_shift_residual": (wan_blocks.scale_shift_residual, (x_fp, x_bf, x_bf)),
    }


@needs_gpu
@pytest.mark.parametrize("name", sorted(_cases("cpu")))
def test_compiled_function_matches_eager(name, fusion_on):
    fn, args = _cases("cuda")[name]
    eager = fn.reference(*args)
    got = fn(*args)
    assert got.dtype == eager.dtype and got.shape == eager.shape
    # Exact arithmetic on the same (rounded) inputs. Eager rounds every intermediate to the input dtype; the compiled
    # kernel keeps intermediates in fp32, so it must be at least as close to exact, give or take one output rounding.
    exact = fn.reference(*[a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]).double()
    eager_err = (eager.double() - exact).abs().max().item()
    fused_err = (got.double() - exact).abs().max().item()
    one_rounding = torch.finfo(got.dtype).eps * exact.abs().max().item()
    assert fused_err <= eager_err + one_rounding, (fused_err, eager_err, one_rounding)


@needs_gpu
def test_lingbot_tiny_chunk_fused_matches_eager(fusion_on):
    from telefuser.models.lingbot_world_v2.checkpoint import build_random_lingbot_dit
    from telefuser.models.lingbot_world_v2.config import LingBotWorldV2Config

    config = LingBotWorldV2Config.tiny_session()
    model = build_random_lingbot_dit(config, 0, "cuda", torch.bfloat16, init_on_device=True).eval()
    g = torch.Generator(device="cpu").manual_seed(0)
    latents = torch.randn(1, config.in_dim, 2, 8, 12, generator=g).cuda()
    text = torch.randn(1, config.text_len, config.text_dim, generator=g).cuda().bfloat16()
    outs = {}
    for fused in (False, True):
        set_fusion(fused)
        session = model.new_window(1, text, tokens_per_frame=24)
        outs[fused] = [
            model.forward_chunk(session, latents, torch.full((1,), t), None, update_cache=t == 0.0)
            for t in (900.0, 0.0, 500.0)
        ]
        session.close()
    for eager, fused in zip(outs[False], outs[True]):
        scale = eager.abs().max()
        assert (fused - eager).abs().max() <= 3e-2 * scale, "compiled chain drifted from eager beyond bf16 rounding"


@needs_gpu
def test_dispatch_mode_runs_the_reference_and_leaves_the_kernel_working(fusion_on):
    from torch.utils.flop_counter import FlopCounterMode

    fn, args = _cases("cuda")["minimax.modulate"]
    compiled = fn(*args)
    with FlopCounterMode(display=False):
        counted = fn(*args)
    torch.testing.assert_close(counted, fn.reference(*args), rtol=0, atol=0)  # the reference ran
    torch.testing.assert_close(fn(*args), compiled, rtol=0, atol=0)  # and the compiled kernel still answers
