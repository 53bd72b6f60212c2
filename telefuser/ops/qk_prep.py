"""Per-head RMSNorm followed by partial NeoX RoPE on Q or K, as one fused kernel on CUDA.

Eager PyTorch runs this as about ten memory-bound kernels (upcast, square, mean, rsqrt, scale, slice, negate, cat,
two multiplies, add, cat). Under Ulysses it sits on the critical path between the V submission and the Q
submission, so fewer passes over Q/K mean an earlier Q/K exchange. On CUDA the same arithmetic is compiled once per
shape with torch.compile (Inductor emits one Triton kernel per tensor); on CPU, or with
``TELEFUSER_FUSED_QK_PREP=0``, the eager reference runs. Both compute in fp32 and round once to the input dtype.
"""

from __future__ import annotations

import os

import torch

_state = {"fused": os.environ.get("TELEFUSER_FUSED_QK_PREP", "1") != "0", "compiled": None}


def set_fused_qk_prep(enabled: bool) -> None:
    """Turn the compiled CUDA kernel on or off for this process (benchmarks toggle it to compare in one run)."""
    _state["fused"] = bool(enabled)


def fused_qk_prep_enabled() -> bool:
    return _state["fused"]


def rms_norm_rope_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor | None, sin: torch.Tensor | None
) -> torch.Tensor:
    """x [B, S, H, D]; weight [D]; cos/sin [S, R] (R <= D, even) or None for no rotation. Returns x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if cos is None:
        return y.to(x.dtype)
    rot = cos.shape[-1]
    half = rot // 2
    y_rot = y[..., :rot]
    rotated_half = torch.cat([-y_rot[..., half:], y_rot[..., :half]], dim=-1)
    out = y_rot * cos[None, :, None, :].float() + rotated_half * sin[None, :, None, :].float()
    return torch.cat([out, y[..., rot:]], dim=-1).to(x.dtype)


def _compiled():
    if _state["compiled"] is None:
        _state["compiled"] = torch.compile(rms_norm_rope_reference, dynamic=None, fullgraph=True)
    return _state["compiled"]


def rms_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm over the last dim with `weight`, then RoPE on the first cos.shape[-1] channels (NeoX halves)."""
    if x.is_cuda and _state["fused"]:
        return _compiled()(x, weight, eps, cos, sin)
    return rms_norm_rope_reference(x, weight, eps, cos, sin)


def norm_rope(norm: torch.nn.RMSNorm, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """`norm` (an nn.RMSNorm over the head dim, with its eps set) then the rotary tables `rope` = (cos, sin) or None."""
    if norm.eps is None:
        raise ValueError("norm_rope needs an nn.RMSNorm with an explicit eps")
    cos, sin = rope if rope is not None else (None, None)
    return rms_norm_rope(x, norm.weight, norm.eps, cos, sin)
