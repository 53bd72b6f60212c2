"""Wan's norms: both compute in fp32 whatever the weights are, as the released model does under autocast."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.fusion import cuda_fused


@cuda_fused
def wan_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return normed * weight.to(x.dtype)


@cuda_fused
def layer_norm_modulate(
    x: torch.Tensor, eps: float, scale: torch.Tensor, shift: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """fp32 LayerNorm without affine, AdaLN ``* (1 + scale) + shift`` in fp32, then the next linear's dtype."""
    normed = F.layer_norm(x.float(), (x.shape[-1],), None, None, eps)
    return (normed * (1 + scale) + shift).to(out_dtype)


@cuda_fused
def layer_norm_to(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float, out_dtype: torch.dtype
) -> torch.Tensor:
    """fp32 LayerNorm (affine in fp32), then the next linear's dtype."""
    weight = weight.float() if weight is not None else None
    bias = bias.float() if bias is not None else None
    return F.layer_norm(x.float(), (x.shape[-1],), weight, bias, eps).to(out_dtype)


class RMSNorm(nn.Module):
    """RMS over the last dim in fp32, cast back to the input dtype, then the learned scale (Wan's WanRMSNorm)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return wan_rms_norm(x, self.weight, self.eps)


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 and returned in fp32 (the residual stream's precision)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)
