"""The stand-in's DiT: the smallest model that meets the `DiT` protocol from the package's parts, so that the
conformance suite (tests/conformance) runs on a model from outside the package as on the registered ones.

A token sequence ``[B, S, channels]`` and a timestep go through pre-norm transformer blocks (self-attention under the
V-first Ulysses exchange, a GELU FFN; the timestep's embedding added to every row) and a linear head. Each rank
embeds its share of the rows and the output rows are gathered; every block runs as one compiled region where regions
compile. Its "release layout": ``config.json`` beside one ``model.safetensors``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.compiled_ops import exchange_key
from telefuser.distributed.ulysses.schedule import gather_heads, v_first
from telefuser.distributed.ulysses.sequence import gather_rows, rank_rows, take_rows
from telefuser.models.checkpoint_io import RANDOM_WEIGHTS, fill_random, finish_loading
from telefuser.models.spec import Example
from telefuser.models.ulysses_owner import UlyssesOwner
from telefuser.ops.attention import attention
from telefuser.ops.attention_registry import check_backend
from telefuser.ops.fp8 import linear_dtype, quantize_blocks
from telefuser.ops.regions import compiled_region, region_compiles

WEIGHTS, CONFIG = "model.safetensors", "config.json"


@dataclass(frozen=True)
class StandInConfig:
    channels: int = 4  # values per token, in and out
    dim: int = 32
    num_heads: int = 4
    ffn_dim: int = 64
    num_layers: int = 2


def dit_config(size: str) -> StandInConfig:
    return StandInConfig()


class StandInBlock(nn.Module):
    def __init__(self, config: StandInConfig):
        super().__init__()
        dim = config.dim
        self.num_heads, self.head_dim = config.num_heads, dim // config.num_heads
        self.norm1 = nn.LayerNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, config.ffn_dim), nn.GELU(), nn.Linear(config.ffn_dim, dim))

    def run(self, x: torch.Tensor, exchange, rows: int, attn_impl: str) -> torch.Tensor:
        """x ``[B, S_local, dim]`` (this rank's rows, padded) -> the same; every row attends to the `rows` valid
        rows of the whole sequence."""
        b, s, _ = x.shape
        normed = self.norm1(x)
        heads = lambda layer: layer(normed.to(linear_dtype(layer))).view(b, s, self.num_heads, self.head_dim)
        q, k, v = v_first(exchange, lambda: heads(self.v), q=lambda: heads(self.q), k=lambda: heads(self.k), anchor=x)
        padded_rows = q.shape[1]
        o = attention(q[:, :rows], k[:, :rows], v[:, :rows], impl=attn_impl)
        o = gather_heads(exchange, F.pad(o, (0, 0, 0, 0, 0, padded_rows - rows)).contiguous())
        x = x + self.o(o.flatten(2)).float()
        return x + self.ffn(self.norm2(x).to(linear_dtype(self.ffn[0]))).float()


stand_in_block_region = compiled_region(StandInBlock.run)


class StandInDiT(UlyssesOwner, nn.Module):
    FP8_LINEARS = ("q", "k", "v", "o", "ffn.0", "ffn.2")

    def __init__(self, config: StandInConfig, *, attn_impl: str = "sdpa"):
        super().__init__()
        self.config = config
        self.embed = nn.Linear(config.channels, config.dim)
        self.time = nn.Linear(config.dim, config.dim)
        self.blocks = nn.ModuleList(StandInBlock(config) for _ in range(config.num_layers))
        self.head = nn.Linear(config.dim, config.channels)
        self.attn_impl = check_backend(attn_impl, head_dim=config.dim // config.num_heads)
        self.weights_source = "constructed (default init)"
        self.communicator: UlyssesCommunicator | None = None
        self.ulysses_group: dist.ProcessGroup | None = None

    def quantize(self, quantization: str) -> list[str]:
        return quantize_blocks(self, quantization, self.FP8_LINEARS)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """tokens ``[B, S, channels]``, t ``[B]`` in [0, 1000] -> ``[B, S, channels]`` fp32."""
        n = tokens.shape[1]
        rank, world = self._ulysses_coordinates()
        rows, padded = rank_rows(n, rank, world)
        x = self.embed(take_rows(tokens, rows, padded).to(self.embed.weight.dtype)).float()
        x = x + self.time(sinusoid(t, self.config.dim).to(self.time.weight.dtype)).float()[:, None]
        exchange = exchange_key(self.communicator) if region_compiles(x) else self.communicator
        for block in self.blocks:
            x = stand_in_block_region(block, x, exchange, n, self.attn_impl)
        out = self.head(x.to(self.head.weight.dtype)).float()
        if world > 1:
            out = gather_rows(out, self.ulysses_group, communicator=self.communicator)
        return out[:, :n].contiguous()


def sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    freqs = torch.exp(-math.log(10000.0) * torch.arange(dim // 2, dtype=torch.float32, device=t.device) / (dim // 2))
    angles = t.float()[:, None] * freqs
    return torch.cat([angles.cos(), angles.sin()], dim=1)


# -- the spec's parts -------------------------------------------------------------------------------------------------
def parallelize(model: StandInDiT, mesh, *, communicator_factory=None) -> StandInDiT:
    """Ulysses only."""
    mesh.config.check_heads(model.config.num_heads)
    model.open_ulysses(mesh, communicator_factory)
    return model


def build_random_stand_in_dit(config, seed, device="cpu", dtype=torch.float32, *, attn_impl="sdpa") -> StandInDiT:
    with torch.device("meta"):
        model = StandInDiT(config, attn_impl=attn_impl)
    fill_random(model, seed, device=torch.device(device), dtype_for=lambda name: dtype)
    finish_loading(model, RANDOM_WEIGHTS, error=ValueError)
    return model


def write_stand_in_dit(model: StandInDiT, directory) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG).write_text(json.dumps(asdict(model.config)))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / WEIGHTS))
    return directory


def load_stand_in_dit(path, *, device, dtype=torch.bfloat16, attn_impl="sdpa") -> StandInDiT:
    """Every tensor in `dtype` (the stand-in keeps nothing in fp32)."""
    path = Path(path)
    config = StandInConfig(**json.loads((path / CONFIG).read_text()))
    with torch.device("meta"):
        model = StandInDiT(config, attn_impl=attn_impl)
    state = {k: v.to(dtype) for k, v in load_file(str(path / WEIGHTS), device=str(device)).items()}
    model.load_state_dict(state, assign=True)
    finish_loading(model, f"checkpoint {path}", error=ValueError)
    return model


def example(model: StandInDiT, *, seed: int = 0, batch: int = 2, rows: int = 18) -> Example:
    g = torch.Generator().manual_seed(seed)
    device = model.embed.weight.device
    tokens = torch.randn(batch, rows, model.config.channels, generator=g).to(device)
    t = (torch.rand(batch, generator=g) * 1000.0).to(device)
    return Example(run=lambda: (model(tokens, t),), shape={"batch": batch, "rows": rows})


def flops(config: StandInConfig, *, batch: int, rows: int) -> int:
    d, f = config.dim, config.ffn_dim
    blocks = config.num_layers * (2 * batch * rows * (4 * d * d + 2 * d * f) + 4 * batch * rows * rows * d)
    return 2 * batch * (rows * config.channels * d * 2 + d * d) + blocks
