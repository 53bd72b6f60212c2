"""Loading the released MiniMax H3 transformer, and building a seeded random one when there is no checkpoint.

Released layout (``<root>/transformer/`` or the transformer directory itself): ``config.json`` plus safetensors
shards ``model-XXXXX-of-XXXXX.safetensors`` listed in ``model.safetensors.index.json``. Tensor names equal this
model's state-dict names. Every ``*.attn.qkv_proj.weight`` is stored grouped per head, ``[(q, k, v) x heads]``;
the loader reorders it to the fused ``[Q; K; V]`` rows the model uses.

The model is built on the meta device and filled one tensor at a time: each tensor is read from its shard (memory
mapped), reordered, sliced for TP when a mesh is given, moved to the target device in its target dtype and
assigned. The host never holds more than one full tensor, and never a full-precision copy of the model.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import torch

from ...distributed.mesh import ParallelMesh
from ..checkpoint_io import (
    RANDOM_WEIGHTS,
    check_keys,
    fill_random,
    finish_loading,
    list_shards,
    load_shards,
    locate_keys,
)
from .config import MiniMaxH3Config
from .dit import FP32_BUFFER_NAMES, FP32_PARAMETER_NAMES, MiniMaxH3DiT
from .tp import apply_tensor_parallel, shard_tensor

log = logging.getLogger(__name__)

INDEX_NAME = "model.safetensors.index.json"
# Recomputable from the config, so a checkpoint may omit it (the release ships it).
OPTIONAL_KEYS = frozenset(FP32_BUFFER_NAMES)


class CheckpointError(RuntimeError):
    """The directory does not hold a loadable MiniMax H3 transformer."""


# -- the grouped per-head QKV layout ------------------------------------------------------------------------------
def grouped_qkv_to_fused(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """[(q_h, k_h, v_h) for each head h] rows -> [Q; K; V] rows."""
    return weight.reshape(num_heads, 3, head_dim, -1).transpose(0, 1).reshape(3 * num_heads * head_dim, -1)


def fused_qkv_to_grouped(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Inverse of `grouped_qkv_to_fused` (writes a checkpoint in the released layout)."""
    return weight.reshape(3, num_heads, head_dim, -1).transpose(0, 1).reshape(3 * num_heads * head_dim, -1)


def is_grouped_qkv(key: str) -> bool:
    return key.endswith(".attn.qkv_proj.weight")


def target_dtype(key: str, dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if key in FP32_PARAMETER_NAMES or key in FP32_BUFFER_NAMES else dtype


# -- locating the files ---------------------------------------------------------------------------------------------
def find_transformer_dir(path: str | Path) -> Path:
    path = Path(path)
    for candidate in (path, path / "transformer"):
        if (candidate / "config.json").is_file():
            return candidate
    hint = ""
    partitions = [p.name for p in ("FL2VA", "Ref2VA") if (path / p / "transformer").is_dir()] if path.is_dir() else []
    if partitions:
        hint = f"; this looks like the release root, pass {path / partitions[0]} (partitions: {', '.join(partitions)})"
    raise CheckpointError(f"no MiniMax H3 transformer at {path}: expected config.json there or in transformer/{hint}")


def find_shards(directory: Path) -> list[Path]:
    shards = list_shards(directory, index_names=(INDEX_NAME,), pattern="model*.safetensors", error=CheckpointError)
    if not shards:
        raise CheckpointError(f"no safetensors shards in {directory} (expected {INDEX_NAME} or model-*.safetensors)")
    return shards


# -- loading ------------------------------------------------------------------------------------------------------
def load_minimax_h3_dit(
    path: str | Path,
    *,
    device: str | torch.device,
    dtype: torch.dtype = torch.bfloat16,
    mesh: ParallelMesh | None = None,
    attn_impl: str = "sdpa",
) -> MiniMaxH3DiT:
    """Load the released transformer onto `device`: `dtype` for the blocks, fp32 for the released fp32 modules.
    With a mesh, TP slicing happens while loading and the model comes back with `enable_parallel(mesh)` applied."""
    directory = find_transformer_dir(path)
    config = MiniMaxH3Config.from_json(directory / "config.json")
    shards = find_shards(directory)
    device = torch.device(device)
    tp_rank, tp_size = (mesh.tp_rank, mesh.config.tp_degree) if mesh is not None else (0, 1)

    with torch.device("meta"):
        model = MiniMaxH3DiT(config, attn_impl=attn_impl)
    if tp_size > 1:
        mesh.config.check_heads(config.num_attention_heads)
        model.tensor_parallel = apply_tensor_parallel(model, mesh.tp_group, tp_rank, tp_size)
    expected = model.state_dict(keep_vars=True)

    found = locate_keys(shards)
    check_keys(set(expected), set(found), directory, model_label="MiniMax H3 DiT", error=CheckpointError,
               optional=OPTIONAL_KEYS)

    heads, head_dim = config.num_attention_heads, config.attention_head_dim

    def to_model_layout(key: str, tensor: torch.Tensor) -> torch.Tensor:
        if is_grouped_qkv(key):
            tensor = grouped_qkv_to_fused(tensor, heads, head_dim)
        return shard_tensor(key, tensor, tp_rank, tp_size)

    load_shards(model, shards, expected, device=device, dtype_for=partial(target_dtype, dtype=dtype),
                error=CheckpointError, prepare=to_model_layout)
    if "rope.inv_freq" not in found:
        model.rope.inv_freq = _rope_inv_freq(config, device)
    finish_loading(model, f"checkpoint {directory}", error=CheckpointError)
    log.info("MiniMax H3 DiT loaded from %s (%d shards, %s, tp=%d)", directory, len(shards), dtype, tp_size)
    if mesh is not None:
        model.enable_parallel(mesh)
    return model


def _rope_inv_freq(config: MiniMaxH3Config, device: torch.device) -> torch.Tensor:
    n = config.rope_inv_freq_len
    return (config.rope_theta ** (-torch.arange(n, dtype=torch.float32) / n)).to(device)


# -- random weights -------------------------------------------------------------------------------------------------
def build_random_minimax_h3_dit(
    config: MiniMaxH3Config,
    seed: int,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    attn_impl: str = "sdpa",
    init_on_device: bool = False,
) -> MiniMaxH3DiT:
    """A DiT with seeded random weights, identical on every rank and device for the same seed and config.

    `init_on_device=True` draws the numbers with the target device's generator instead of the CPU's: minutes faster
    for the 62 GB official model on a GPU, identical across ranks, but not equal to the CPU draw.

    Linear weights ~ N(0, 1/fan_in) keep activations O(1) through the stack; biases and the deviation of norm
    weights from 1 are small; the AdaLN projections are random too (the release zero-initialises them for
    training), so every path of the model is exercised."""
    device = torch.device(device)
    with torch.device("meta"):
        model = MiniMaxH3DiT(config, attn_impl=attn_impl)
    fill_random(model, seed, device=device, dtype_for=partial(target_dtype, dtype=dtype),
                init_on_device=init_on_device)
    model.rope.inv_freq = _rope_inv_freq(config, device)
    finish_loading(model, RANDOM_WEIGHTS, error=CheckpointError)
    log.warning("MiniMax H3 DiT: random weights (no checkpoint), seed %d -- outputs are meaningless", seed)
    return model
