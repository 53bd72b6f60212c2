"""A stand-in with the LingBot DiT's KV-window interface, for the pipeline's tests. NOT the LingBot model.

Interface it shares with ``telefuser.models.lingbot_world_v2.dit.LingBotWorldV2DiT``::

    window = dit.new_window(batch, text_states [B, L, text_dim], tokens_per_frame=..., device=..., dtype=...)
    flow = dit.forward_chunk(window, latents [B, in_dim, F, h, w], t [B], camera_features, update_cache=bool)
    dit.camera_modulation(camera_features); dit.commit_chunk(window, latents, t, camera_features)
    window.close(); dit.enable_parallel(mesh); dit.close()

Its "model": a fixed random 1x1x1 projection of the input channels, shifted by the mean text state, the timestep
and the mean of the clean latents committed so far (its "KV cache"), so it is deterministic, causal across chunks,
and every call is recorded for the tests (`window.calls`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class ToyDiTConfig:
    in_dim: int = 36
    out_dim: int = 16
    text_dim: int = 32
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 64
    camera_channels: int = 6 * 8 * 8


@dataclass
class ToyWindow:
    batch: int
    tokens_per_frame: int
    device: torch.device
    dtype: torch.dtype
    text_bias: torch.Tensor | None
    memory: torch.Tensor | None = None  # mean of committed clean latents, [B, out_dim, 1, 1, 1]
    committed_frames: int = 0
    calls: list[dict] = field(default_factory=list)
    closed: bool = False

    def close(self) -> None:
        self.memory = None
        self.text_bias = None
        self.closed = True


class ToyCausalDiT(nn.Module):
    def __init__(self, config: ToyDiTConfig | None = None, seed: int = 0) -> None:
        super().__init__()
        self.config = config or ToyDiTConfig()
        c = self.config
        g = torch.Generator().manual_seed(seed)
        self.proj = nn.Parameter(
            torch.randn(c.out_dim, c.in_dim, generator=g) / math.sqrt(c.in_dim), requires_grad=False
        )
        self.text_proj = nn.Parameter(
            torch.randn(c.out_dim, c.text_dim, generator=g) / math.sqrt(c.text_dim), requires_grad=False
        )
        self.camera_proj = nn.Parameter(
            torch.randn(c.out_dim, c.camera_channels, generator=g) * 0.01, requires_grad=False
        )
        self.weights_source = "toy stand-in DiT (not LingBot; random)"
        self.parallel_mesh = None

    def new_window(self, batch: int, text_states: torch.Tensor, *, tokens_per_frame: int, device, dtype) -> ToyWindow:
        if text_states.dim() != 3 or text_states.shape[0] != batch or text_states.shape[-1] != self.config.text_dim:
            raise ValueError(
                f"text_states must be [{batch}, L, {self.config.text_dim}], got {tuple(text_states.shape)}"
            )
        text_bias = (
            torch.einsum("oc,blc->bo", self.text_proj.to(text_states.device, torch.float32), text_states.float())
            / text_states.shape[1]
        )
        return ToyWindow(batch, tokens_per_frame, torch.device(device), dtype, text_bias.view(batch, -1, 1, 1, 1))

    def forward_chunk(
        self,
        window: ToyWindow,
        latents: torch.Tensor,
        t: torch.Tensor,
        camera_features: torch.Tensor | None = None,
        *,
        update_cache: bool = False,
    ) -> torch.Tensor:
        if window.closed:
            raise RuntimeError("window is closed")
        c = self.config
        b, channels, frames, h, w = latents.shape
        if channels != c.in_dim or b != window.batch:
            raise ValueError(f"latents must be [{window.batch}, {c.in_dim}, F, h, w], got {tuple(latents.shape)}")
        if (h // c.patch_size[1]) * (w // c.patch_size[2]) != window.tokens_per_frame:
            raise ValueError("latent grid does not match tokens_per_frame")
        x = latents.float()
        x0_hat = torch.einsum("oc,bcfhw->bofhw", self.proj.to(x.device), x) + window.text_bias
        if window.memory is not None:
            x0_hat = x0_hat + 0.5 * window.memory
        if camera_features is not None:
            x0_hat = x0_hat + torch.einsum("oc,bcfhw->bofhw", self.camera_proj.to(x.device), camera_features.float())
        x0_hat = 0.5 * torch.tanh(x0_hat + torch.sin(t.float() / 1000.0).view(b, 1, 1, 1, 1))
        flow = x[:, : c.out_dim] - x0_hat  # flow = noise - x0 for x_t = (1 - s) x0 + s noise when x_t ~ noise
        window.calls.append(
            {
                "t": [float(v) for v in t.flatten()],
                "update_cache": bool(update_cache),
                "frames": frames,
                "camera": camera_features is not None,
            }
        )
        if update_cache:
            mean = x[:, : c.out_dim].mean(dim=(2, 3, 4), keepdim=True)
            n = window.committed_frames
            window.memory = mean if window.memory is None else (window.memory * n + mean * frames) / (n + frames)
            window.committed_frames = n + frames
        return flow.to(window.dtype)

    def camera_modulation(self, camera_features: torch.Tensor) -> torch.Tensor:
        return camera_features  # nothing to precompute per chunk

    def commit_chunk(
        self, window: ToyWindow, latents: torch.Tensor, t: torch.Tensor, camera_features: torch.Tensor | None = None
    ) -> None:
        self.forward_chunk(window, latents, t, camera_features, update_cache=True)

    def enable_parallel(self, mesh) -> None:
        self.parallel_mesh = mesh  # every rank computes the same thing; nothing to shard

    def close(self) -> None:
        self.parallel_mesh = None
