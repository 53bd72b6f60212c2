"""Attention dispatch over the backends that may be installed.

All entry points take and return ``[B, S, H, D]`` (sequence-major, the Ulysses layout). torch SDPA is always there;
on Hopper its cuDNN backend is the fastest one measured on the lent H200 (see docs). flash-attn-4, SageAttention and
cuDNN's FP8 attention (``cudnn_fp8``: nvidia-cudnn-frontend on SM90+, see attention_fp8.py) are used when importable
and asked for; asking for a missing one is an error, never a silent fallback.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention_fp8 import fp8_attention, fp8_attention_available

ATTENTION_IMPLS = ("sdpa", "flash_attn_4", "sage", "cudnn_fp8", "identity")


# torch's default SDPA order tries flash first; on Hopper cuDNN is much faster (574 vs 364 TFLOP/s at a Wan 14B shape,
# 633 vs 363 at a LingBot chunk, measured on the lent H200). Backends that cannot take a shape are skipped in order.
CUDA_SDPA_PRIORITY = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """torch SDPA on [B, H, S, D] tensors, cuDNN first on CUDA."""
    if q.is_cuda:
        with sdpa_kernel(CUDA_SDPA_PRIORITY, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def available_attention_impls() -> list[str]:
    found = ["sdpa", "identity"]  # identity: returns Q; for profiling the communication around attention only
    if importlib.util.find_spec("flash_attn") is not None and importlib.util.find_spec("flash_attn.cute") is not None:
        found.append("flash_attn_4")
    if importlib.util.find_spec("sageattention") is not None:
        found.append("sage")
    if fp8_attention_available()[0]:
        found.append("cudnn_fp8")
    return found


def check_attention_impl(impl: str) -> str:
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; choose one of {', '.join(ATTENTION_IMPLS)}")
    if impl not in available_attention_impls():
        if impl == "cudnn_fp8":
            raise RuntimeError(f"attention implementation {impl!r} was asked for but {fp8_attention_available()[1]}")
        package = {"flash_attn_4": "flash-attn-4", "sage": "sageattention"}[impl]
        raise RuntimeError(f"attention implementation {impl!r} was asked for but {package} is not installed")
    return impl


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, impl: str = "sdpa", causal: bool = False
) -> torch.Tensor:
    """Softmax attention on [B, S, H, D] tensors; returns [B, S_q, H, D] (contiguous)."""
    if impl == "identity":
        return q.contiguous()
    if impl == "sdpa":
        out = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
        return out.transpose(1, 2).contiguous()
    if impl == "flash_attn_4":
        from flash_attn.cute import flash_attn_func

        out = flash_attn_func(q, k, v, causal=causal)
        return (out[0] if isinstance(out, tuple) else out).contiguous()
    if impl == "sage":
        from sageattention import sageattn

        return sageattn(q, k, v, tensor_layout="NHD", is_causal=causal).contiguous()
    if impl == "cudnn_fp8":
        return fp8_attention(q, k, v, causal=causal)
    raise ValueError(f"unknown attention implementation {impl!r}")
