"""The Wan DiT block and output head, with the released checkpoint's names.

Residual stream in fp32, linears in their weight dtype. The block reads top to bottom: 6-way AdaLN modulation from
the timestep, gated self-attention, an optional per-row scale and shift of the residual (LingBot's camera; none in
plain Wan), cross-attention to the prompt, gated FFN. Which self-attention runs is the caller's (`run_layers` takes
it as a function): the whole sequence (`WanBlock.run_sequence`) or a KV window (LingBot).

The timestep's modulation is one per sample (a tensor ``[B, n, dim]``, the same for every row) or one per row
(`RowModulation`: Wan 2.2 TI2V-5B's image condition, whose first latent frame's rows run at t = 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ...ops.fp8 import linear_dtype
from ...ops.fusion import cuda_fused
from ...ops.regions import compiled_region
from .attention import CachedCrossAttention, WanSelfAttention, run_linear
from .config import MODULATION_PARAMS, WanConfig
from .embeddings import RowModulation
from .norms import FP32LayerNorm, layer_norm_modulate, layer_norm_to

Rope = tuple[torch.Tensor, torch.Tensor]


TimeModulation = torch.Tensor | RowModulation  # [B, n, dim] (one per sample) or one per row


def modulation_vectors(learned: torch.Tensor, t_mod: TimeModulation) -> tuple[torch.Tensor, ...]:
    """A learned table ``[1, n, dim]`` plus the timestep's modulation, as its n vectors (fp32): each ``[B, 1, dim]``
    (one timestep per sample) or ``[B, S_local, dim]`` (one per row)."""
    if isinstance(t_mod, RowModulation):
        mod = (learned.float() + t_mod.table)[t_mod.index]  # [K, n, dim] -> [B, S, n, dim]: each row its entry
    else:
        mod = (learned.float() + t_mod).unsqueeze(1)  # [B, 1, n, dim]: the same for every row
    return mod.unbind(2)


@cuda_fused
def gated_residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x + update.float() * gate


@cuda_fused
def residual_add(x: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    return x + update.float()


@cuda_fused
def scale_shift_residual(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return (1.0 + scale.float()) * x + shift.float()


class WanBlock(nn.Module):
    def __init__(self, config: WanConfig, self_attention: type[WanSelfAttention] = WanSelfAttention):
        super().__init__()
        dim, eps = config.dim, config.eps
        self.norm1 = FP32LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.self_attn = self_attention(dim, config.num_heads, eps)
        self.norm3 = FP32LayerNorm(dim, eps=eps, elementwise_affine=True) if config.cross_attn_norm else nn.Identity()
        self.cross_attn = CachedCrossAttention(dim, config.num_heads, eps)
        self.norm2 = FP32LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(config.ffn_dim, dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, MODULATION_PARAMS, dim) / dim**0.5)

    def run_sequence(
        self,
        x: torch.Tensor,
        t_mod: TimeModulation,
        rope: Rope,
        rows: int,
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        exchange,
        attn_impl: str,
    ) -> torch.Tensor:
        """x ``[B, S_local, dim]`` fp32 (this rank's rows) -> the same; t_mod ``[B, 6, dim]`` fp32 (or a
        `RowModulation` of this rank's rows); `rows` valid rows of the whole sequence; `exchange`: the Ulysses exchange
        (a communicator or its compiled-op key), None dense. What `wan_block_region` compiles."""
        attend = lambda normed: self.self_attn(normed, exchange, rope, rows, attn_impl)
        return self.run_layers(x, t_mod, attend, cross_kv, attn_impl)

    def run_layers(
        self,
        x: torch.Tensor,
        t_mod: TimeModulation,
        self_attention: Callable[[torch.Tensor], torch.Tensor | None],
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        attn_impl: str,
        residual_scale_shift: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """The block around `self_attention(normed x)`; a None from it (its K/V are all the caller needed) ends the
        block with None. `residual_scale_shift` ``[B, S_local, dim]`` each scales and shifts the residual after
        self-attention."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation_vectors(self.modulation, t_mod)
        dtype = linear_dtype(self.ffn[0])  # the linears' dtype; the residual stream stays fp32
        y = self_attention(layer_norm_modulate(x, self.norm1.eps, scale_msa, shift_msa, dtype))
        if y is None:
            return None
        x = gated_residual(x, y, gate_msa)
        if residual_scale_shift is not None:
            x = scale_shift_residual(x, *residual_scale_shift)
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


# One compiled function for every full-sequence Wan block: region(block, x, t_mod, rope, rows, cross_kv, exchange, impl)
wan_block_region = compiled_region(WanBlock.run_sequence)


class WanHead(nn.Module):
    """Final LayerNorm, shift/scale from the time embedding (not its 6-way projection), linear to patch values."""

    def __init__(self, config: WanConfig):
        super().__init__()
        dim = config.dim
        self.norm = FP32LayerNorm(dim, eps=config.eps, elementwise_affine=False)
        self.head = nn.Linear(dim, config.out_dim * math.prod(config.patch_size))
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x: torch.Tensor, t_emb: torch.Tensor | RowModulation) -> torch.Tensor:
        """x ``[B, S, dim]`` fp32, t_emb ``[B, dim]`` fp32 (or a `RowModulation` of ``[K, dim]`` embeddings) ->
        ``[B, S, out_dim * patch volume]`` fp32."""
        if isinstance(t_emb, RowModulation):
            t_emb = t_emb._replace(table=t_emb.table[:, None, :])
        else:
            t_emb = t_emb[:, None, :]
        shift, scale = modulation_vectors(self.modulation, t_emb)
        return run_linear(self.head, self.norm(x) * (1 + scale) + shift).float()


def keeps_fp32(name: str) -> bool:
    """Parameters the released model computes in fp32 (its autocast(float32) regions): the time embedding and
    projection, every modulation table, and the output head."""
    return name.startswith(("time_embedding.", "time_projection.", "head.")) or name.endswith("modulation")
