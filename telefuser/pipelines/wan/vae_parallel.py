"""Height-sharded Wan VAE decode: each rank decodes a horizontal band of latent rows; the result equals a full decode.

A copy of diffusers' ``WanDecoder3d`` that shares its parameters swaps the modules that mix rows for wrappers (3x3
convolutions take halo rows from the neighbours, the mid-block attention sees the gathered band), so diffusers' own
forward runs unchanged on the band. Why nothing else needs communication: this folder's README.
"""

from __future__ import annotations

import copy
import itertools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def split_rows(rows: int, parts: int) -> list[int]:
    """Latent rows per rank, as even as possible (the first ``rows % parts`` ranks get one more)."""
    if parts < 1:
        raise ValueError(f"need at least one rank, got {parts}")
    if rows < parts:
        raise ValueError(f"cannot split {rows} latent rows over {parts} ranks (each rank needs at least one row)")
    base, extra = divmod(rows, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


class RowExchange:
    """Collectives over a process group along the row (height) axis of this rank's band."""

    def __init__(self, group=None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def pad_rows(self, x: torch.Tensor, n: int, dim: int = -2) -> torch.Tensor:
        """`x` with `n` rows of the rank above prepended and `n` of the rank below appended (zeros at the edges)."""
        if n == 0:
            return x
        if x.shape[dim] < n:
            raise ValueError(f"a band of {x.shape[dim]} rows cannot give a halo of {n} rows")
        payload = torch.cat([x.narrow(dim, 0, n), x.narrow(dim, x.shape[dim] - n, n)], dim).contiguous()
        gathered = [torch.empty_like(payload) for _ in range(self.world_size)]
        dist.all_gather(gathered, payload, group=self.group)
        zeros = torch.zeros_like(payload.narrow(dim, 0, n))
        above = gathered[self.rank - 1].narrow(dim, n, n) if self.rank > 0 else zeros
        below = gathered[self.rank + 1].narrow(dim, 0, n) if self.rank < self.world_size - 1 else zeros
        return torch.cat([above, x, below], dim)

    def gather_rows(self, x: torch.Tensor, rows: list[int], dim: int = -2) -> torch.Tensor:
        """Concatenate every rank's band (``rows[r]`` rows each) along `dim`; bands may differ by a row."""
        dim = dim % x.dim()
        tallest = max(rows)
        padded = x
        if x.shape[dim] < tallest:
            pad_shape = list(x.shape)
            pad_shape[dim] = tallest - x.shape[dim]
            padded = torch.cat([x, x.new_zeros(pad_shape)], dim)
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded.contiguous(), group=self.group)
        return torch.cat([g.narrow(dim, 0, r) for g, r in zip(gathered, rows)], dim)


class _HaloCausalConv3d(nn.Module):
    """A ``WanCausalConv3d`` whose H padding comes from the neighbouring bands."""

    def __init__(self, conv, exchange: RowExchange) -> None:
        super().__init__()
        self.conv = conv
        self.exchange = exchange

    def forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        conv = self.conv
        w_left, w_right, h_top, h_bottom, t_front, t_back = conv._padding
        if cache_x is not None and t_front > 0:  # same time handling as WanCausalConv3d.forward
            x = torch.cat([cache_x.to(x.device), x], dim=2)
            t_front -= cache_x.shape[2]
        x = F.pad(x, (w_left, w_right, 0, 0, t_front, t_back))
        assert h_top == h_bottom
        x = self.exchange.pad_rows(x, h_top)
        return F.conv3d(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)


class _HaloConv2d(nn.Module):
    """The 3x3 ``nn.Conv2d`` after a 2x upsample, with its H padding from the neighbouring bands."""

    def __init__(self, conv: nn.Conv2d, exchange: RowExchange) -> None:
        super().__init__()
        self.conv = conv
        self.exchange = exchange

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv
        pad_h, pad_w = conv.padding
        x = F.pad(x, (pad_w, pad_w, 0, 0))
        x = self.exchange.pad_rows(x, pad_h)
        return F.conv2d(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)


class _GatheredAttention(nn.Module):
    """Wan's per-frame spatial attention on the full frame; returns this rank's rows."""

    def __init__(self, attention, exchange: RowExchange, latent_rows: list[int]) -> None:
        super().__init__()
        self.attention = attention
        self.exchange = exchange
        self.latent_rows = latent_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.shape[-2] // self.latent_rows[self.exchange.rank]
        rows = [r * scale for r in self.latent_rows]
        full = self.attention(self.exchange.gather_rows(x, rows))
        return full.narrow(-2, sum(rows[: self.exchange.rank]), rows[self.exchange.rank])


class HeightShardedDecoder:
    """The decoder rewired for this rank's band of ``latent_height`` rows; build once per (VAE, group, height)."""

    def __init__(self, decoder: nn.Module, latent_height: int, group=None) -> None:
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock, WanCausalConv3d

        self.exchange = RowExchange(group)
        self.latent_rows = split_rows(latent_height, self.exchange.world_size)
        self.row_start = sum(self.latent_rows[: self.exchange.rank])
        memo = {id(t): t for t in itertools.chain(decoder.parameters(), decoder.buffers())}
        self.decoder = copy.deepcopy(decoder, memo)  # new module tree, same weight tensors
        swaps = []
        for parent in self.decoder.modules():
            for name, child in parent.named_children():
                if isinstance(child, WanCausalConv3d) and child._padding[2] > 0:
                    swaps.append((parent, name, _HaloCausalConv3d(child, self.exchange)))
                elif isinstance(child, nn.Conv2d) and child.padding[0] > 0:
                    swaps.append((parent, name, _HaloConv2d(child, self.exchange)))
                elif isinstance(child, WanAttentionBlock):
                    swaps.append((parent, name, _GatheredAttention(child, self.exchange, self.latent_rows)))
        for parent, name, wrapper in swaps:
            setattr(parent, name, wrapper)

    @property
    def world_size(self) -> int:
        return self.exchange.world_size

    def local_rows(self, latents: torch.Tensor) -> torch.Tensor:
        """This rank's latent rows of a full ``[..., h, w]`` tensor."""
        return latents.narrow(-2, self.row_start, self.latent_rows[self.exchange.rank])

    def gather_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """This rank's uint8 ``[T, rows, W, 3]`` band -> the full ``[T, H, W, 3]`` frames on every rank."""
        scale = frames.shape[1] // self.latent_rows[self.exchange.rank]
        return self.exchange.gather_rows(frames, [r * scale for r in self.latent_rows], dim=1)
