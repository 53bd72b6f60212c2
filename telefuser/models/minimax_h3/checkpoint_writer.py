"""Writing a MiniMax H3 DiT in the MiniMaxAI release layout: ``transformer/config.json`` (class
``MiniMaxH3DiTModel``) beside ``model-0000i-of-0000N.safetensors`` shards and ``model.safetensors.index.json``, each
fused QKV weight with its rows interleaved per head (q, k, v of head 0, then head 1, ...) as released, where this
model keeps them stacked ``[Q; K; V]``. What the conformance suite's round trip writes; `load_minimax_h3_dit` reads
it back bit for bit (it takes such files as interleaved from their class name and shard names)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..shard_writer import write_shards
from .checkpoint_formats import RELEASE_CLASS, is_qkv
from .config import MiniMaxH3Config
from .dit import MiniMaxH3DiT

INDEX_NAME = "model.safetensors.index.json"


def fused_qkv_to_grouped(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """This model's ``[Q; K; V]`` rows -> the release's ``[(q_h, k_h, v_h) for each head h]`` (the inverse of
    `checkpoint_formats.grouped_qkv_to_fused`)."""
    return weight.reshape(3, num_heads, head_dim, -1).transpose(0, 1).reshape(3 * num_heads * head_dim, -1)


def release_tensors(model: MiniMaxH3DiT) -> dict[str, torch.Tensor]:
    """The dense model's tensors as the release stores them (names are the release's already)."""
    config: MiniMaxH3Config = model.config
    if model.tensor_parallel is not None:
        raise ValueError("write a dense model: this one is split for tensor parallelism")
    tensors = {}
    for name, value in model.state_dict().items():
        if is_qkv(name):
            value = fused_qkv_to_grouped(value, config.num_attention_heads, config.attention_head_dim)
        tensors[name] = value
    return tensors


def write_minimax_h3_release(model: MiniMaxH3DiT, root: str | Path, *, shards: int = 2) -> Path:
    """`model` under ``root/transformer/`` in the release layout; returns `root` (a release partition folder)."""
    directory = Path(root) / "transformer"
    directory.mkdir(parents=True, exist_ok=True)
    config = {"_class_name": RELEASE_CLASS, **model.config.to_dict()}
    config.pop("rope_theta")  # the released config does not carry it; its rope.inv_freq table does
    (directory / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    write_shards(release_tensors(model), directory, stem="model", index_name=INDEX_NAME, shards=shards)
    return Path(root)
