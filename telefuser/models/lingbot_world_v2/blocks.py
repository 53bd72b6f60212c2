"""The causal DiT block (Wan I2V block + camera injection) and the output head, with the checkpoint's names.

Residual stream in fp32; the camera scale/shift applies after self-attention and before cross-attention.
`block_region` runs a block as one compiled region on CUDA (`ops.regions`): one compiled function for every block.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.fp8 import linear_dtype
from ...ops.fusion import cuda_fused
from ...ops.regions import compiled_region
from .attention import CachedCrossAttention, CausalSelfAttention, ChunkContext, ChunkInputs, run_linear
from .config import MODULATION_PARAMS, LingBotWorldV2Config
from .kv_cache import LayerState
from .norms import FP32LayerNorm, layer_norm_modulate, layer_norm_to


@cuda_fused
def gated_residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x + update.float() * gate


@cuda_fused
def residual_add(x: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    return x + update.float()


@cuda_fused
def camera_modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return (1.0 + scale.float()) * x + shift.float()


class LingBotBlock(nn.Module):
    def __init__(self, config: LingBotWorldV2Config):
        super().__init__()
        dim, eps = config.dim, config.eps
        self.norm1 = FP32LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.self_attn = CausalSelfAttention(dim, config.num_heads, eps)
        self.norm3 = FP32LayerNorm(dim, eps=eps, elementwise_affine=True) if config.cross_attn_norm else nn.Identity()
        self.cross_attn = CachedCrossAttention(dim, config.num_heads, eps)
        self.norm2 = FP32LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(config.ffn_dim, dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, MODULATION_PARAMS, dim) / dim**0.5)
        self.cam_injector_layer1 = nn.Linear(dim, dim)
        self.cam_injector_layer2 = nn.Linear(dim, dim)
        self.cam_scale_layer = nn.Linear(dim, dim)
        self.cam_shift_layer = nn.Linear(dim, dim)

    def camera_scale_shift(self, cam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This block's camera scale and shift ``[B, S_local, dim]`` from the chunk's embedded rays: four d x d
        linears that depend on neither t nor x, so a chunk computes them once for all of its forwards."""
        c = run_linear(self.cam_injector_layer2, F.silu(run_linear(self.cam_injector_layer1, cam))) + cam
        return run_linear(self.cam_scale_layer, c), run_linear(self.cam_shift_layer, c)

    def forward(
        self,
        x: torch.Tensor,
        t_mod: torch.Tensor,
        camera: tuple[torch.Tensor, torch.Tensor] | None,
        layer: int,
        ctx: ChunkContext,
        *,
        kv_only: bool = False,
    ) -> torch.Tensor | None:
        """x ``[B, S_local, dim]`` fp32; t_mod ``[B, 6, dim]`` fp32; camera: this block's (scale, shift) or None.
        With `kv_only` the block commits its K/V and returns None: nothing after the window is needed. The reference
        path (the session called directly)."""
        attend = lambda normed: self.self_attn(normed, layer, ctx, kv_only=kv_only)  # noqa: E731
        return self._run(x, t_mod, camera, attend, ctx.session.cross(layer), ctx.attn_impl)

    def run(
        self,
        x: torch.Tensor,
        t_mod: torch.Tensor,
        camera: tuple[torch.Tensor, torch.Tensor] | None,
        layer: LayerState,
        chunk: ChunkInputs,
        *,
        kv_only: bool = False,
    ) -> torch.Tensor | None:
        """`forward` from the layer's tensors and the chunk's inputs: what `block_region` compiles and a CUDA graph
        captures."""
        attend = lambda normed: self.self_attn.attend(normed, layer, chunk, kv_only=kv_only)  # noqa: E731
        return self._run(x, t_mod, camera, attend, (layer.cross_k, layer.cross_v), chunk.attn_impl)

    def _run(self, x, t_mod, camera, self_attention: Callable, cross_kv, attn_impl: str) -> torch.Tensor | None:
        mod = (self.modulation.float() + t_mod).unsqueeze(1)  # [B, 1, 6, dim]: the same for every row
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.unbind(2)
        dtype = linear_dtype(self.ffn[0])  # the linears' dtype; the residual stream stays fp32
        y = self_attention(layer_norm_modulate(x, self.norm1.eps, scale_msa, shift_msa, dtype))
        if y is None:
            return None
        x = gated_residual(x, y, gate_msa)
        if camera is not None:
            x = camera_modulate(x, *camera)
        normed = (
            layer_norm_to(x, self.norm3.weight, self.norm3.bias, self.norm3.eps, dtype)
            if isinstance(self.norm3, FP32LayerNorm)
            else x
        )
        x = residual_add(x, self.cross_attn(normed, cross_kv, attn_impl))
        y = run_linear(
            self.ffn[2],
            self.ffn[1](run_linear(self.ffn[0], layer_norm_modulate(x, self.norm2.eps, scale_mlp, shift_mlp, dtype))),
        )
        return gated_residual(x, y, gate_mlp)


# One compiled function for every block of every model: region(block, x, t_mod, camera, layer_state, chunk, kv_only=)
block_region = compiled_region(LingBotBlock.run)


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
