"""Q/K RMSNorm + partial RoPE: the fp32 reference equals the module composition it replaces, and the compiled CUDA
kernel equals the reference within bf16 rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from telefuser.ops.fusion import set_fusion
from telefuser.ops.qk_prep import norm_rope, rms_norm_rope, rms_norm_rope_reference
from telefuser.ops.rotary import apply_rotary, rope_frequencies

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)


def _case(device="cpu", dtype=torch.float32, seq=37, heads=3, head_dim=16, rotary=12):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(2, seq, heads, head_dim, generator=g) * 3 + 0.5).to(device, dtype)
    norm = nn.RMSNorm(head_dim, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(head_dim, generator=g) + 0.5)
    cos, sin = rope_frequencies(torch.arange(seq) * 3 + 1, rotary)
    return x, norm.to(device), cos.to(device), sin.to(device)


def test_reference_equals_rmsnorm_then_rotary_fp32():
    x, norm, cos, sin = _case()
    expected = apply_rotary(norm(x), cos, sin)
    got = norm_rope(norm, x, (cos, sin))
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert not torch.equal(got, norm(x))  # the rotation did act


def test_without_rope_is_plain_rmsnorm():
    x, norm, _, _ = _case()
    torch.testing.assert_close(norm_rope(norm, x, None), norm(x), rtol=1e-6, atol=1e-6)


def test_norm_without_eps_is_refused():
    x, _, cos, sin = _case()
    with pytest.raises(ValueError, match="explicit eps"):
        norm_rope(nn.RMSNorm(x.shape[-1]), x, (cos, sin))


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU on this machine: the compiled kernel runs on CUDA only"
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_cuda_kernel_matches_reference(dtype):
    x, norm, cos, sin = _case("cuda", dtype, seq=1000, heads=14, head_dim=128, rotary=96)
    view = torch.randn(2, 1000, 3, 14, 128, device="cuda", dtype=dtype).unbind(2)[0]  # strided view of a fused QKV
    view.copy_(x)
    expected = rms_norm_rope_reference(x.float(), norm.weight, 1e-5, cos, sin)
    set_fusion(True)
    got = rms_norm_rope(view, norm.weight, 1e-5, cos, sin)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)  # one bf16/fp16 rounding of O(1) values
