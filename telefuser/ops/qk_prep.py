"""Per-head RMSNorm followed by partial NeoX RoPE on Q or K, as one fused kernel on CUDA.

Under Ulysses it sits on the critical path between the V and the Q submission, so one pass instead of about ten
means an earlier Q/K exchange; the eager reference runs on the CPU or with ``TELEFUSER_FUSION=0`` (this folder's
README).
"""

from __future__ import annotations

import torch

from .fusion import cuda_fused


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


rms_norm_rope = cuda_fused(rms_norm_rope_reference)
rms_norm_rope.__doc__ = "RMSNorm over the last dim with `weight`, then RoPE on the first cos.shape[-1] channels."


def norm_rope(norm: torch.nn.RMSNorm, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """`norm` (an nn.RMSNorm over the head dim, with its eps set) then the rotary tables `rope` = (cos, sin) or None."""
    if norm.eps is None:
        raise ValueError("norm_rope needs an nn.RMSNorm with an explicit eps")
    cos, sin = rope if rope is not None else (None, None)
    return rms_norm_rope(x, norm.weight, norm.eps, cos, sin)
