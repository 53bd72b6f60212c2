"""The DiT's blocks: SwiGLU MLP, text token refiner, AdaLN-modulated joint block, final layer (checkpoint names).

`block_region` runs a joint block as one compiled region on CUDA (`ops.regions`), AdaLN tables or projection included.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.fusion import cuda_fused
from ...ops.regions import compiled_region
from .attention import AttentionContext, JointAttention
from .config import ADALN_MODALITIES, ADALN_PARAMS_PER_MODALITY, FINAL_ADALN_PARAMS, MiniMaxH3Config
from .modulation import AdaLNProjection, gated_residual, modulate, norm_modulate


@cuda_fused
def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class SwiGLU(nn.Module):
    """fc1 -> [gate | up] -> silu(gate) * up -> fc2; bias-free."""

    def __init__(self, hidden_size: int, ffn_size: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, 2 * ffn_size, bias=False)
        self.fc2 = nn.Linear(ffn_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(swiglu(self.fc1(x)))


def _attention(config: MiniMaxH3Config) -> JointAttention:
    return JointAttention(
        config.hidden_size, config.num_attention_heads, config.attention_head_dim, qk_norm_eps=config.qk_norm_eps
    )


class TokenRefinerBlock(nn.Module):
    """A plain pre-norm transformer block over the text rows: no AdaLN, no RoPE."""

    def __init__(self, config: MiniMaxH3Config):
        super().__init__()
        self.norm1 = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = _attention(config)
        self.norm2 = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.ffn_hidden_size)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), ctx)
        return x + self.mlp(self.norm2(x))


class TokenRefiner(nn.Module):
    def __init__(self, config: MiniMaxH3Config):
        super().__init__()
        self.blocks = nn.ModuleList(TokenRefinerBlock(config) for _ in range(config.token_refiner_num_layers))
        self.final_norm = nn.RMSNorm(config.hidden_size, eps=config.final_norm_eps)

    def forward(self, text: torch.Tensor, attn_impl: str) -> torch.Tensor:
        ctx = AttentionContext(attn_impl=attn_impl)  # all text rows, one document, no rotary, no sequence split
        for block in self.blocks:
            text = block(text, ctx)
        return self.final_norm(text)


class MiniMaxH3Block(nn.Module):
    """norm1 -> modulate -> joint attention -> gated residual; norm2 -> modulate -> SwiGLU -> gated residual."""

    def __init__(self, config: MiniMaxH3Config):
        super().__init__()
        self.norm1 = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.norm2 = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = _attention(config)
        self.mlp = SwiGLU(config.hidden_size, config.ffn_hidden_size)
        self.adaln_proj = AdaLNProjection(
            config.time_embed_dim, config.hidden_size, params=ADALN_PARAMS_PER_MODALITY, modalities=ADALN_MODALITIES
        )

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor | None,
        rows: torch.Tensor,
        ctx: AttentionContext,
        adaln: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """x: [B, S, hidden]; cond: [M, time_embed_dim]; rows: [B, S] AdaLN table rows (timestep x modality).
        `adaln`: this block's six tables, precomputed as ``self.adaln_proj(cond)`` (adaln_tables.AdaLNTables); then
        cond is unused."""
        tables = self.adaln_proj(cond) if adaln is None else adaln
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = tables
        h = self.attn(norm_modulate(x, self.norm1.weight, self.norm1.eps, shift_msa, scale_msa, rows), ctx)
        x = gated_residual(x, gate_msa, h, rows)
        h = self.mlp(norm_modulate(x, self.norm2.weight, self.norm2.eps, shift_mlp, scale_mlp, rows))
        return gated_residual(x, gate_mlp, h, rows)


# One compiled function for every joint block: region(block, x, cond, rows, ctx, adaln)
block_region = compiled_region(MiniMaxH3Block.forward)


class FinalLayer(nn.Module):
    """Final RMSNorm, a shift/scale modulation per timestep (no modality split), then fp32 output heads."""

    def __init__(self, config: MiniMaxH3Config):
        super().__init__()
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.final_norm_eps)
        self.adaln_proj = AdaLNProjection(
            config.time_embed_dim, config.hidden_size, params=FINAL_ADALN_PARAMS, modalities=1
        )
        self.video_out = nn.Linear(config.hidden_size, config.video_patch_dim)
        self.audio_out = nn.Linear(config.hidden_size, config.audio_latents_dim)

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor | None,
        timesteps: torch.Tensor,
        adaln: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        """timesteps: [B, S] conditioning row per token; `adaln`: the precomputed ``self.adaln_proj(cond)``.
        Returns (video [B, S, patch_dim], audio [B, S, channels])."""
        shift, scale = self.adaln_proj(cond) if adaln is None else adaln
        h = modulate(self.norm(x), shift, scale, timesteps)
        h = h.to(self.video_out.weight.dtype)  # the heads are fp32 in the release: keep their precision
        return self.video_out(h), self.audio_out(h)
