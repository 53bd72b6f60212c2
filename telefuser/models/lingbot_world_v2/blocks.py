"""The causal DiT block: Wan's block (`models.wan.blocks.WanBlock`) with the camera layers and the windowed
self-attention, plus `block_region` (the block as one compiled region).

The camera's scale/shift applies to the residual after self-attention and before cross-attention. `block_region`
runs a block as one compiled region on CUDA (`ops.regions`), and as it is elsewhere: one function for every block.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.regions import compiled_region
from ..wan.attention import run_linear
from ..wan.blocks import WanBlock
from .attention import CausalSelfAttention, ChunkInputs
from .config import LingBotWorldV2Config


class LingBotBlock(WanBlock):
    def __init__(self, config: LingBotWorldV2Config):
        super().__init__(config, CausalSelfAttention)
        dim = config.dim
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
        layer: tuple,
        chunk: ChunkInputs,
        *,
        kv_only: bool = False,
    ) -> torch.Tensor | None:
        """x ``[B, S_local, dim]`` fp32; t_mod ``[B, 6, dim]`` fp32; camera: this block's (scale, shift) or None;
        layer: this block's window state. With `kv_only` the block writes its K/V and returns None: nothing after
        the window is needed."""
        attend = functools.partial(self.self_attn, layer=layer, chunk=chunk, kv_only=kv_only)
        return self.run_layers(x, t_mod, attend, (layer.cross_k, layer.cross_v), chunk.attn_impl, camera)


# One compiled function for every block of every model: region(block, x, t_mod, camera, layer, chunk, kv_only=)
block_region = compiled_region(LingBotBlock.forward)
