"""`Wan22DiT`: one Wan 2.2 expert, a plain Wan DiT over the whole sequence (`models.wan`), in the released names.

    text = dit.text_kv(text_states)            # every block's prompt K/V, once per request (cond and uncond batched)
    flow = dit(latents, t, text)               # [B, out_dim, F, H, W] fp32; B = 2 for CFG (cond, uncond)

t is one timestep per sample ``[B]``, or one per token ``[B, N]`` (TI2V-5B's image condition: the first latent
frame's tokens at t = 0), as diffusers' `WanTransformer3DModel` takes it. Under Ulysses each rank embeds and runs its
share of the rows (per-token timesteps split as the tokens) and the output rows are gathered, so every rank (called
with identical inputs) returns the full prediction. On CUDA every block runs as one compiled region
(`models.wan.blocks.wan_block_region`); elsewhere as it is.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...distributed.ulysses import UlyssesCommunicator
from ...distributed.ulysses.compiled_ops import exchange_key
from ...distributed.ulysses.sequence import gather_rows, rank_rows, take_rows
from ...memory.streaming import StreamedLayers
from ...ops.attention_registry import check_backend, warn_failed_gate
from ...ops.fp8 import linear_dtype, quantize_blocks
from ...ops.regions import region_compiles
from ..block_streaming import BlockStreaming
from ..ulysses_owner import UlyssesOwner
from ..wan.blocks import WanBlock, WanHead, wan_block_region
from ..wan.config import MODULATION_PARAMS
from ..wan.embeddings import (
    RowModulation,
    embed_patches,
    embed_text,
    embed_time,
    embed_time_per_row,
    patchify,
    unpatchify,
)
from ..wan.rope import chunk_rope
from .config import Wan22Config

TextKV = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per block: the prompt's cross-attention K, V [B, L, H, D]
MAX_TIMESTEP = 1000.0
# Attention backends that failed the quality gate on this DiT (backend -> where the result is written)
FAILED_ATTENTION_GATES = {"cudnn_fp8": "docs/perf/2026-12-07"}


class Wan22DiT(UlyssesOwner, BlockStreaming, nn.Module):
    # FP8 GEMMs for what dominates a forward: self-attention q/k/v/o, cross-attention q/o (the prompt's K/V are
    # computed once per request) and the FFN. Embeddings, modulation and head stay in their dtype.
    FP8_LINEARS = (
        "self_attn.q",
        "self_attn.k",
        "self_attn.v",
        "self_attn.o",
        "cross_attn.q",
        "cross_attn.o",
        "ffn.0",
        "ffn.2",
    )

    def __init__(self, config: Wan22Config, *, attn_impl: str = "sdpa"):
        super().__init__()
        self.config = config
        dim = config.dim
        self.patch_embedding = nn.Conv3d(config.in_dim, dim, kernel_size=config.patch_size, stride=config.patch_size)
        self.text_embedding = nn.Sequential(
            nn.Linear(config.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(config.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, MODULATION_PARAMS * dim))
        self.blocks = nn.ModuleList(WanBlock(config) for _ in range(config.num_layers))
        self.head = WanHead(config)

        self.attn_impl = check_backend(attn_impl, head_dim=config.head_dim)
        warn_failed_gate("Wan 2.2", self.attn_impl, FAILED_ATTENTION_GATES)
        self.weights_source = "constructed (default init)"
        self.communicator: UlyssesCommunicator | None = None  # owned by the model, shared by every block
        self.ulysses_group: dist.ProcessGroup | None = None
        self._rope_cache: tuple[tuple, tuple[torch.Tensor, torch.Tensor]] | None = None
        self.block_stream: StreamedLayers | None = None  # stream_blocks(): blocks visit the device one at a time

    def quantize(self, quantization: str) -> list[str]:
        """Apply ``"fp8"`` (ops.fp8) to every block's FP8_LINEARS in place, or nothing for ``"none"``; returns the
        names quantized. Call it on a loaded model, before it runs."""
        return quantize_blocks(self, quantization, self.FP8_LINEARS)

    @property
    def compute_dtype(self) -> torch.dtype:
        return linear_dtype(self.blocks[0].self_attn.q)

    @torch.no_grad()
    def text_kv(self, text_states: torch.Tensor) -> TextKV:
        """Encoder states ``[B, L, text_dim]`` (L <= text_len, padding rows zero) -> every block's prompt K/V. The
        states are zero-padded to text_len and all text_len rows are attended, as released."""
        cfg = self.config
        if text_states.dim() != 3 or text_states.shape[2] != cfg.text_dim or text_states.shape[1] > cfg.text_len:
            raise ValueError(
                f"text_states must be [B, L <= {cfg.text_len}, {cfg.text_dim}], got {tuple(text_states.shape)}"
            )
        device = self.patch_embedding.weight.device
        text = F.pad(text_states.to(device), (0, 0, 0, cfg.text_len - text_states.shape[1]))
        context = embed_text(self.text_embedding, text)
        dtype = self.compute_dtype
        return tuple(
            tuple(t.to(dtype).contiguous() for t in block.cross_attn.text_kv(context))
            for _, block in self._each_block()
        )

    @torch.no_grad()
    def forward(self, latents: torch.Tensor, t: torch.Tensor, text: TextKV) -> torch.Tensor:
        """Flow prediction ``[B, out_dim, F, H, W]`` (fp32) for latents ``[B, in_dim, F, H, W]`` at timesteps t
        in [0, 1000] (the scheduler's, not rescaled), ``[B]`` or per token ``[B, N]`` (N = F*H*W / patch volume, raster
        (f, h, w) order), against the prompt K/V `text` (`text_kv`, batch B)."""
        grid = self._check(latents, t, text)
        cfg = self.config
        n = grid[0] * grid[1] * grid[2]
        rank, world = self._ulysses_coordinates()
        rows, padded = rank_rows(n, rank, world)
        x = embed_patches(self.patch_embedding, take_rows(patchify(latents, cfg.patch_size), rows, padded))
        t_emb, t_mod = self._embed_time(t.to(latents.device), rows, padded)
        rope = self._rope(grid, latents.device)
        exchange = exchange_key(self.communicator) if region_compiles(x) else self.communicator
        for index, block in self._each_block():
            x = wan_block_region(block, x, t_mod, rope, n, text[index], exchange, self.attn_impl)
        out = self.head(x, t_emb)
        if world > 1:
            out = gather_rows(out, self.ulysses_group, communicator=self.communicator)
        return unpatchify(out[:, :n], grid, cfg.patch_size).contiguous()

    def _embed_time(self, t: torch.Tensor, rows: slice, padded: int):
        """(t_emb, t_mod) of timesteps ``[B]`` (``[B, dim]``, ``[B, 6, dim]``), or of per-token ones ``[B, N]``:
        `RowModulation`s whose row indices are this rank's rows, split as the tokens are."""
        embedding = (self.time_embedding, self.time_projection, self.config.freq_dim)
        if t.dim() == 1:
            return embed_time(*embedding, t)
        t_emb, t_mod = embed_time_per_row(*embedding, t)
        index = take_rows(t_emb.index[..., None], rows, padded)[..., 0]  # padding rows take entry 0; they are dropped
        return RowModulation(t_emb.table, index), RowModulation(t_mod.table, index)

    def _rope(self, grid: tuple[int, int, int], device) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE of every row from frame 0; a request's steps share it (computed once per shape)."""
        key = (grid, str(device))
        if self._rope_cache is None or self._rope_cache[0] != key:
            cfg = self.config
            self._rope_cache = (key, chunk_rope(0, *grid, cfg.head_dim, theta=cfg.rope_theta, device=device))
        return self._rope_cache[1]

    def _check(self, latents: torch.Tensor, t: torch.Tensor, text: TextKV) -> tuple[int, int, int]:
        cfg = self.config
        if latents.dim() != 5 or latents.shape[1] != cfg.in_dim:
            raise ValueError(f"latents must be [B, {cfg.in_dim}, F, H, W], got {tuple(latents.shape)}")
        b, _, f, h, w = latents.shape
        pt, ph, pw = cfg.patch_size
        if f % pt or h % ph or w % pw:
            raise ValueError(f"latent grid {(f, h, w)} does not split into {cfg.patch_size} patches")
        tokens = (f // pt) * (h // ph) * (w // pw)
        if t.shape not in ((b,), (b, tokens)):
            raise ValueError(f"t must be [B={b}] or per token [B={b}, N={tokens}], got {tuple(t.shape)}")
        if t.device.type == "cpu" and not bool(((t >= 0) & (t <= MAX_TIMESTEP)).all()):  # no device sync
            shown = t.tolist() if t.dim() == 1 else f"values from {t.min().item():g} to {t.max().item():g}"
            raise ValueError(f"t must lie in [0, {MAX_TIMESTEP:g}], got {shown}")
        if len(text) != len(self.blocks) or text[0][0].shape[0] != b:
            raise ValueError(f"text must be this model's text_kv for a batch of {b}")
        return f // pt, h // ph, w // pw
