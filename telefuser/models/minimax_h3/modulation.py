"""Per-token AdaLN: one modulation table per (timestep, modality), each row picked by the token it modulates.

Projected values are laid out ``[modality 0 params | modality 1 params | ...]``, so viewed as
``[M * modalities, params * hidden]``, row ``timestep_index * modalities + tag`` holds one token's parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.fusion import cuda_fused


class AdaLNProjection(nn.Module):
    def __init__(self, cond_dim: int, hidden_size: int, *, params: int, modalities: int):
        super().__init__()
        self.params, self.modalities, self.hidden_size = params, modalities, hidden_size
        self.linear = nn.Linear(cond_dim, params * modalities * hidden_size)

    def forward(self, cond: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """cond: [M, cond_dim] -> `params` tables of [M * modalities, hidden]."""
        out = self.linear(cond.to(self.linear.weight.dtype))
        return out.view(-1, self.params * self.hidden_size).chunk(self.params, dim=-1)


def timestep_rows(timestep_slots: torch.Tensor, batch: int) -> torch.Tensor:
    """Conditioning row of each token, [B, S]. Conditioning rows are ordered [video t of items 0..B-1, audio t of
    items 0..B-1], so item b's token in slot s (0 video, 1 audio) reads row s*B + b."""
    return timestep_slots[None, :] * batch + torch.arange(batch, device=timestep_slots.device)[:, None]


def table_rows(tags: torch.Tensor, timesteps: torch.Tensor, modalities: int = 3) -> torch.Tensor:
    """AdaLN table row of each token, [B, S]: timestep row * modalities + tag (padding, tag -1, reads video's)."""
    return timesteps * modalities + tags.clamp(min=0)[None, :]


# Each is one compiled kernel on CUDA (ops.fusion): eagerly, every F.embedding materialises a full [B, S, hidden]
# table before the multiply-add reads it again.
@cuda_fused
def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return x * (1 + F.embedding(rows, scale)) + F.embedding(rows, shift)


@cuda_fused
def norm_modulate(
    x: torch.Tensor, weight: torch.Tensor, eps: float, shift: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """`modulate(nn.RMSNorm(x), ...)` in one pass."""
    return modulate.reference(F.rms_norm(x, (x.shape[-1],), weight, eps), shift, scale, rows)


@cuda_fused
def gated_residual(residual: torch.Tensor, gate: torch.Tensor, update: torch.Tensor, rows: torch.Tensor):
    return residual + F.embedding(rows, gate) * update
