"""Faster layouts and kernels for diffusers' Wan 2.1 VAE, opt-in and measured (`tools/bench/wan_vae_bench.py`).

* `fuse_norm_activations`: every ``WanRMS_norm`` that a SiLU follows (the residual blocks' two and the head's) runs
  as one compiled kernel, norm and SiLU together in float32 with one rounding. Eager bf16 runs six memory-bound
  passes there (upcast, norm, divide, downcast, scale, SiLU) over tensors of up to 300 MB per frame group.
* `to_channels_last`: convolution weights in channels-last, so cuDNN keeps activations in the layout its tensor-core
  kernels read instead of transposing around every convolution.

`optimize_vae` applies both (what each saves, and the PSNR against the eager bf16 decode, are in docs/perf).
Both change only the order of float operations (tested against eager with a bound); the state dict and module tree
stay as diffusers builds them, so checkpoints load the same way.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

_compiled = None


def _rms_norm_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``silu(F.normalize(x, dim=1) * weight + bias)`` computed in float32, rounded once to x's dtype."""
    xf = x.float()
    normalized = xf / torch.linalg.vector_norm(xf, dim=1, keepdim=True).clamp_min(1e-12)  # F.normalize's eps
    return F.silu(normalized * weight + bias).to(x.dtype)


def _kernel(compile: bool):
    global _compiled
    if not compile:
        return _rms_norm_silu
    if _compiled is None:  # one compiled function for every norm: dynamic shapes, no per-layer recompiles
        _compiled = torch.compile(_rms_norm_silu, dynamic=True, fullgraph=True)
    return _compiled


def _fused_forward(norm: nn.Module, kernel, x: torch.Tensor) -> torch.Tensor:
    # scale and bias as tensors: a Python float per norm would specialize the compiled kernel once per layer
    weight = norm.gamma.float() * norm.scale
    bias = norm.bias.float() if isinstance(norm.bias, torch.Tensor) else weight.new_zeros(())
    return kernel(x, weight, bias)


def fuse_norm_activations(model: nn.Module, *, compile: bool = True) -> int:
    """Fuse each ``norm -> nonlinearity`` pair of an ``AutoencoderKLWan`` in place; returns how many norms were fused.

    A module whose ``nonlinearity`` is a SiLU and whose norms feeding it are named ``norm1``/``norm2`` (residual
    blocks) or ``norm_out`` (encoder and decoder heads) gets those norms' forward replaced and its nonlinearity made
    an identity; those are the only places diffusers calls that nonlinearity. Idempotent."""
    kernel = _kernel(compile)
    fused = 0
    for module in model.modules():
        activation = getattr(module, "nonlinearity", None)
        norms = [getattr(module, n) for n in ("norm1", "norm2", "norm_out") if hasattr(module, n)]
        if not norms or not isinstance(activation, nn.SiLU):
            continue
        if any(not getattr(n, "channel_first", False) or not hasattr(n, "gamma") for n in norms):
            raise TypeError(f"{type(module).__name__}: expected channel-first WanRMS_norm modules to fuse")
        for norm in norms:
            norm.forward = partial(_fused_forward, norm, kernel)
            fused += 1
        module.nonlinearity = nn.Identity()
    return fused


def to_channels_last(model: nn.Module) -> int:
    """Put every 5-D parameter in channels-last-3d and every 4-D one in channels-last; returns how many moved."""
    moved = 0
    for param in model.parameters():
        layout = {5: torch.channels_last_3d, 4: torch.channels_last}.get(param.dim())
        if layout is not None and not param.is_contiguous(memory_format=layout):
            param.data = param.data.contiguous(memory_format=layout)
            moved += 1
    return moved


def optimize_vae(model: nn.Module) -> None:
    """Channels-last weights, then fused norm + SiLU kernels (what ``--vae-fast`` turns on)."""
    to_channels_last(model)
    fuse_norm_activations(model)
