"""Wan's norms: both compute in fp32 whatever the weights are, as the released model does under autocast."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMS over the last dim in fp32, cast back to the input dtype, then the learned scale (Wan's WanRMSNorm)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype)
        return normed * self.weight.to(x.dtype)


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 and returned in fp32 (the residual stream's precision)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)
