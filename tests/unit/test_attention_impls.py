"""Attention implementation registry on the CPU: ``cudnn_fp8`` (cuDNN's FP8 attention) is known, never listed
without a CUDA GPU, and asking for it where it cannot run is a clear error, as for the other optional backends.
The kernel itself is tested on a GPU (tests/gpu/test_attention_fp8_cuda.py); its e4m3 quantization is plain torch
and is checked here."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from telefuser.ops.attention import attention
from telefuser.ops.attention_registry import available_names, backend_names, check_backend
from telefuser.ops.attention_fp8 import FP8, fp8_attention, fp8_attention_available, quantize_fp8


def _qkv(s_q=8, s_kv=12, h=2, d=16):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, s, h, d, generator=g).to(torch.bfloat16) for s in (s_q, s_kv, s_kv))


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def no_cudnn(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn -> ImportError, wherever it is installed


def test_cudnn_fp8_is_a_known_impl():
    assert "cudnn_fp8" in backend_names()


def test_not_listed_without_a_gpu(no_gpu):
    assert "cudnn_fp8" not in available_names()
    assert {"sdpa", "identity"} <= set(available_names())
    ok, why = fp8_attention_available()
    assert not ok and "no CUDA GPU" in why


def test_check_backend_refuses_it_without_a_gpu(no_gpu):
    with pytest.raises(RuntimeError, match="'cudnn_fp8' was asked for but no CUDA GPU"):
        check_backend("cudnn_fp8")
    assert check_backend("sdpa") == "sdpa"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_not_listed_on_this_cpu_machine():
    assert "cudnn_fp8" not in available_names()


def test_attention_raises_clearly_without_cudnn(no_cudnn):
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="nvidia-cudnn-frontend"):
        attention(q, k, v, impl="cudnn_fp8")
    with pytest.raises(RuntimeError, match="nvidia-cudnn-frontend"):
        fp8_attention(q, k, v)


def test_cpu_tensors_are_refused_even_with_cudnn_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        attention(q, k, v, impl="cudnn_fp8")


def test_known_scales_entry_refuses_clearly(monkeypatch, no_cudnn):
    from telefuser.ops.attention_fp8 import cast_fp8, fp8_attention_known_scales

    q, k, v = _qkv()
    k8, descale, amax = cast_fp8(k, torch.tensor([8.0])), torch.tensor([0.125]), v.abs().amax().float().reshape(1)
    with pytest.raises(RuntimeError, match="nvidia-cudnn-frontend"):
        fp8_attention_known_scales(q, k8, descale, v, amax)
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        fp8_attention_known_scales(q, k8, descale, v, amax)


def test_cast_fp8_saturates_instead_of_overflowing():
    from telefuser.ops.attention_fp8 import cast_fp8

    x = torch.tensor([1.0, -2.0, 1e6, -1e6, 0.0], dtype=torch.bfloat16)
    got = cast_fp8(x, torch.tensor([4.0])).float()
    assert torch.equal(got, torch.tensor([4.0, -8.0, 448.0, -448.0, 0.0]))  # exact: e4m3 holds these


def test_availability_reports_a_missing_frontend(monkeypatch, no_cudnn):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    ok, why = fp8_attention_available()
    assert not ok and "nvidia-cudnn-frontend" in why and "not installed" in why


def test_availability_refuses_pre_hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "A100")
    ok, why = fp8_attention_available()
    assert not ok and "SM90" in why and "SM80" in why


def test_quantize_fp8_per_tensor_round_trip():
    x = torch.randn(2, 33, 3, 16, dtype=torch.bfloat16) * 3
    x[0, 5, 1, 7] = -40.0  # the amax
    values, scale, descale = quantize_fp8(x)
    assert values.dtype == FP8 and values.shape == x.shape and values.is_contiguous()
    assert scale.shape == descale.shape == (1,) and scale.dtype == descale.dtype == torch.float32
    assert torch.allclose(scale * descale, torch.ones(1))
    assert values[0, 5, 1, 7].float().item() == -448.0  # the largest value lands on e4m3's largest
    back = values.float() * descale
    normal = x.float().abs() * scale >= 2.0**-6  # e4m3 normal range: 3 mantissa bits, <= 2^-4 relative rounding
    rel = ((back - x.float()).abs() / x.float().abs())[normal]
    assert rel.max().item() <= 2.0**-4 + 1e-6


def test_quantize_fp8_reads_any_strides():
    qkv = torch.randn(1, 10, 3, 2, 16, dtype=torch.bfloat16)  # fused [B, S, 3, H, D]
    view = qkv[:, :, 1]
    assert not view.is_contiguous()
    got, copy = quantize_fp8(view), quantize_fp8(view.contiguous())
    assert got[0].is_contiguous()
    assert torch.equal(got[0].view(torch.uint8), copy[0].view(torch.uint8)) and torch.equal(got[2], copy[2])


def test_quantize_fp8_all_zeros_stays_finite():
    values, scale, descale = quantize_fp8(torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16))
    assert torch.isfinite(scale).all() and torch.isfinite(descale).all()
    assert (values.float() == 0).all()
