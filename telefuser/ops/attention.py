"""Attention on ``[B, S, H, D]`` tensors (sequence-major, the Ulysses layout) through a registered backend.

`attention(q, k, v, impl=name)` runs the backend registered as `name` (ops/attention_registry.py, where the names,
the checks and ``auto``'s resolution live). Defined here: torch SDPA (``sdpa``: always there; on Hopper its cuDNN
backend is the fastest one measured on the lent H200, see docs), flash-attn-4 (``flash_attn_4``), PyPI's Triton
SageAttention 1.0.6 (``sage``) and ``identity`` (returns Q, for profiling what surrounds attention). cuDNN's FP8
attention (``cudnn_fp8``) and SageAttention2's SM90 kernel (``sage_sm90``) register themselves in attention_fp8.py
and attention_sage.py. Asking for a backend that is not installed is an error, never a silent fallback.

Inside a compiled region (`ops.regions`) attention is the opaque custom op ``telefuser::attention``: the backend, SDPA's
kernel priority and the optional kernels run eagerly inside it, and a KV window's length or a packed sequence's
documents reach it as CPU tensors (`kv_rows`, `documents`), so neither recompiles the region. A backend registered as
``traced`` (FP8 attention, ``sage_sm90``) is traced there instead, its quantization fused into the region, around its
own kernel op.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import attention_fp8, attention_sage  # noqa: F401 - they register their backends before a region traces one
from .attention_registry import Verdict, attention_backend, get_backend
from .opaque import fresh_output

HALF_DTYPES = ("bfloat16", "float16")  # what flash-attn and SageAttention take

# torch's default SDPA order tries flash first; on Hopper cuDNN is much faster at our shapes (docs/perf). Backends
# that cannot take a shape are skipped in order.
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


def _always() -> Verdict:
    return True, "part of torch"


def _installed(package: str, *modules: str) -> Verdict:
    if all(importlib.util.find_spec(module) is not None for module in modules):
        return True, f"{package} is installed"
    return False, f"{package} is not installed"


@attention_backend("sdpa", available=_always, host=True)
def _sdpa_bshd(q, k, v, *, causal: bool = False) -> torch.Tensor:
    return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal).transpose(1, 2).contiguous()


@attention_backend(
    "flash_attn_4", available=lambda: _installed("flash-attn-4", "flash_attn", "flash_attn.cute"), dtypes=HALF_DTYPES
)
def _flash_attn_4(q, k, v, *, causal: bool = False) -> torch.Tensor:
    from flash_attn.cute import flash_attn_func

    out = flash_attn_func(q, k, v, causal=causal)
    return (out[0] if isinstance(out, tuple) else out).contiguous()


@attention_backend("sage", available=lambda: _installed("sageattention", "sageattention"), dtypes=HALF_DTYPES)
def _sage(q, k, v, *, causal: bool = False) -> torch.Tensor:
    from sageattention import sageattn

    return sageattn(q, k, v, tensor_layout="NHD", is_causal=causal).contiguous()


@attention_backend("identity", available=_always, host=True)
def _identity(q, k, v, *, causal: bool = False) -> torch.Tensor:
    return q.contiguous()


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    impl: str = "sdpa",
    causal: bool = False,
    kv_rows: torch.Tensor | None = None,
    documents: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention on [B, S, H, D] tensors; returns [B, S_q, H, D] (contiguous).

    `kv_rows` (CPU int64 ``[1]``): attend to the first kv_rows rows of k and v only (a KV window's filled prefix).
    `documents` (CPU int64 ``[n, 2]``): (start, stop) row ranges that attend only within themselves; None, or one
    range, means the whole sequence."""
    if not torch.compiler.is_compiling():
        return _attention(q, k, v, impl, causal, kv_rows, documents)
    backend = get_backend(impl)
    if backend.traced and kv_rows is None and documents is None:
        return backend.run(q, k, v, causal=causal)  # traced: its quantization fuses into the region
    return torch.ops.telefuser.attention(q, k, v, impl, causal, kv_rows, documents)


def _attention(q, k, v, impl: str, causal: bool, kv_rows, documents) -> torch.Tensor:
    if kv_rows is not None:
        rows = int(kv_rows)
        k, v = k[:, :rows], v[:, :rows]
    if documents is None or len(documents) == 1:
        return _one_sequence(q, k, v, impl, causal)
    parts = [_one_sequence(q[:, a:b], k[:, a:b], v[:, a:b], impl, causal) for a, b in documents.tolist()]
    return torch.cat(parts, dim=1)


def _one_sequence(q, k, v, impl: str, causal: bool) -> torch.Tensor:
    return get_backend(impl).run(q, k, v, causal=causal)


@torch.library.custom_op("telefuser::attention", mutates_args=())
def _attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    impl: str,
    causal: bool,
    kv_rows: torch.Tensor | None,
    documents: torch.Tensor | None,
) -> torch.Tensor:
    return fresh_output(_attention(q, k, v, impl, causal, kv_rows, documents), q, k, v)


@_attention_op.register_fake
def _(q, k, v, impl, causal, kv_rows, documents):
    return q.new_empty(q.shape)
