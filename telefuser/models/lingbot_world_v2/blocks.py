"""The causal DiT block and the output head. Parameter names are those of the official checkpoint.

Block (Wan I2V block + camera injection), residual stream in fp32::

    shift, scale, gate (x2) = modulation + time_projection(t)            # 6-way, per batch item
    x = x + gate_msa * self_attn(LN(x) * (1 + scale_msa) + shift_msa)
    c = cam_injector_layer2(silu(cam_injector_layer1(cam))) + cam       # cam: the chunk's embedded rays
    x = (1 + cam_scale_layer(c)) * x + cam_shift_layer(c)                 # after self-attn, before cross-attn
    x = x + cross_attn(norm3(x), text K/V)
    x = x + gate_mlp * ffn(LN(x) * (1 + scale_mlp) + shift_mlp)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import CachedCrossAttention, CausalSelfAttention, ChunkContext, run_linear
from .config import MODULATION_PARAMS, LingBotWorldV2Config
from .norms import FP32LayerNorm


class LingBotBlock(nn.Module):
    def __init__(self, config: LingBotWorldV2Config):
        super().__init__()
        dim, eps = config.dim, config.eps
        self.norm1 = FP32LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.self_attn = CausalSelfAttention(dim, config.num_heads, eps)
        self.norm3 = FP32LayerNorm(dim, eps=eps, elementwise_affine=True) if config.cross_attn_norm else nn.Identity()
        self.cross_attn = CachedCrossAttention(dim, config.num_heads, eps)
        self.norm2 = FP32LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(config.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, MODULATION_PARAMS, dim) / dim**0.5)
        self.cam_injector_layer1 = nn.Linear(dim, dim)
        self.cam_injector_layer2 = nn.Linear(dim, dim)
        self.cam_scale_layer = nn.Linear(dim, dim)
        self.cam_shift_layer = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, t_mod: torch.Tensor, cam: torch.Tensor | None, layer: int, ctx: ChunkContext
    ) -> torch.Tensor:
        """x ``[B, S_local, dim]`` fp32; t_mod ``[B, 6, dim]`` fp32; cam ``[B, S_local, dim]`` or None."""
        mod = (self.modulation.float() + t_mod).unsqueeze(1)  # [B, 1, 6, dim]: the same for every row
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.unbind(2)
        y = self.self_attn(self.norm1(x) * (1 + scale_msa) + shift_msa, layer, ctx)
        x = x + y.float() * gate_msa
        if cam is not None:
            c = run_linear(self.cam_injector_layer2, F.silu(run_linear(self.cam_injector_layer1, cam))) + cam
            x = (1.0 + run_linear(self.cam_scale_layer, c).float()) * x + run_linear(self.cam_shift_layer, c).float()
        x = x + self.cross_attn(self.norm3(x), ctx.session.cross(layer), ctx.attn_impl).float()
        y = run_linear(self.ffn[2], self.ffn[1](run_linear(self.ffn[0], self.norm2(x) * (1 + scale_mlp) + shift_mlp)))
        return x + y.float() * gate_mlp


class LingBotHead(nn.Module):
    """Final LayerNorm, shift/scale from the time embedding (not its 6-way projection), linear to patch values."""

    def __init__(self, config: LingBotWorldV2Config):
        super().__init__()
        dim = config.dim
        self.norm = FP32LayerNorm(dim, eps=config.eps, elementwise_affine=False)
        self.head = nn.Linear(dim, config.out_dim * math.prod(config.patch_size))
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        """x ``[B, S, dim]`` fp32, t_emb ``[B, dim]`` fp32 -> ``[B, S, out_dim * patch volume]`` fp32."""
        shift, scale = (self.modulation.float() + t_emb[:, None, :]).unsqueeze(1).unbind(2)
        return run_linear(self.head, self.norm(x) * (1 + scale) + shift).float()
