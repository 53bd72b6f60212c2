"""Attention dispatch over the backends that may be installed.

All entry points take and return ``[B, S, H, D]`` (sequence-major, the Ulysses layout). torch SDPA is always there;
on Hopper its cuDNN backend is the fastest one measured on the lent H200 (see docs). flash-attn-4, SageAttention and
cuDNN's FP8 attention (``cudnn_fp8``: nvidia-cudnn-frontend on SM90+, see attention_fp8.py) and SageAttention2's SM90
kernel (``sage_sm90``: INT8 Q·K / FP8 P·V, built from source, see attention_sage.py) are used when importable and asked
for; asking for a missing one is an error, never a silent fallback. ``sage`` is PyPI's Triton ``sageattention`` 1.0.6.
``auto`` names no backend: an entry point resolves it (`resolve_attention_impl`) to the first of its model's preferred
ones that is usable on this machine and device, and all ranks agree on the result before the model is built.

Inside a compiled region (`ops.regions`) attention is the opaque custom op ``telefuser::attention``: the backend
choice, SDPA's kernel priority and the optional kernels run eagerly inside it, and a KV window's length or a packed
sequence's documents reach it as CPU tensors (`kv_rows`, `documents`), so neither recompiles the region. FP8 attention
and ``sage_sm90`` are traced there instead (their quantization fuses into the region) around their own kernel ops
(`attention_fp8.py`, `attention_sage.py`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention_fp8 import fp8_attention, fp8_attention_available
from .attention_sage import HEAD_DIMS as SAGE_HEAD_DIMS
from .attention_sage import sage_sm90_attention, sage_sm90_available
from .opaque import fresh_output

ATTENTION_IMPLS = ("sdpa", "flash_attn_4", "sage", "cudnn_fp8", "sage_sm90", "identity")
AUTO = "auto"  # --attn-impl auto: a model's preferred implementation that runs here (resolve_attention_impl)
HOST_ATTENTION_IMPLS = ("sdpa", "identity")  # the ones that take CPU tensors; the others are CUDA kernels


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


def available_attention_impls() -> list[str]:
    found = ["sdpa", "identity"]  # identity: returns Q; for profiling the communication around attention only
    if importlib.util.find_spec("flash_attn") is not None and importlib.util.find_spec("flash_attn.cute") is not None:
        found.append("flash_attn_4")
    if importlib.util.find_spec("sageattention") is not None:
        found.append("sage")
    if fp8_attention_available()[0]:
        found.append("cudnn_fp8")
    if sage_sm90_available()[0]:
        found.append("sage_sm90")
    return found


def check_attention_impl(impl: str) -> str:
    if impl == AUTO:
        raise ValueError(
            f"attention implementation {AUTO!r} is resolved by a model's entry point (resolve_attention_impl with the "
            f"model's preference); name one here: {', '.join(ATTENTION_IMPLS)}"
        )
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; choose one of {', '.join(ATTENTION_IMPLS)}")
    if impl not in available_attention_impls():
        if impl == "cudnn_fp8":
            raise RuntimeError(f"attention implementation {impl!r} was asked for but {fp8_attention_available()[1]}")
        if impl == "sage_sm90":
            raise RuntimeError(f"attention implementation {impl!r} was asked for but {sage_sm90_available()[1]}")
        package = {"flash_attn_4": "flash-attn-4", "sage": "sageattention"}[impl]
        raise RuntimeError(f"attention implementation {impl!r} was asked for but {package} is not installed")
    return impl


def takes_head_dim(impl: str, head_dim: int) -> bool:
    """Whether `impl` runs attention heads of `head_dim` channels (SageAttention2's SM90 kernel: 64 or 128 only)."""
    return impl != "sage_sm90" or head_dim in SAGE_HEAD_DIMS


def resolve_attention_impl(
    requested: str,
    preference: Sequence[str],
    device: torch.device | str | None = None,
    head_dim: int | None = None,
) -> str:
    """The implementation to run: `requested` itself, checked (`check_attention_impl`, the same errors), or for
    ``"auto"`` the first of `preference` that is usable here: installed (`available_attention_impls`, for the current
    CUDA device), one that takes host tensors when `device` is given and is not a CUDA device, and one that takes
    the model's `head_dim` when given. A local decision: ranks that resolve it separately agree on the result
    (`ModelSpec.attention_impl`)."""
    if requested != AUTO:
        return check_attention_impl(requested)
    unknown = [impl for impl in preference if impl not in ATTENTION_IMPLS]
    if unknown or not preference:
        raise ValueError(f"{AUTO!r} needs a preference of known attention implementations, got {list(preference)}")
    usable = available_attention_impls()
    if device is not None and torch.device(device).type != "cuda":
        usable = [impl for impl in usable if impl in HOST_ATTENTION_IMPLS]
    if head_dim is not None:
        usable = [impl for impl in usable if takes_head_dim(impl, head_dim)]
    for impl in preference:
        if impl in usable:
            return impl
    raise RuntimeError(
        f"attention implementation {AUTO!r} found none of {', '.join(preference)} usable here "
        f"(usable: {', '.join(usable)})"
    )


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
    if impl == "cudnn_fp8" and kv_rows is None and documents is None:
        return fp8_attention(q, k, v, causal=causal)  # traced: the quantization fuses into the region
    if impl == "sage_sm90" and kv_rows is None and documents is None:
        return sage_sm90_attention(q, k, v, causal=causal)  # traced likewise
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
    if impl == "sage_sm90":
        return sage_sm90_attention(q, k, v, causal=causal)
    raise ValueError(f"unknown attention implementation {impl!r}")


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
