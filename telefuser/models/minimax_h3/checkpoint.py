"""Loading a MiniMax H3 transformer checkpoint (release, re-export or diffusers layout), or building a random one.

Built on meta, parallelized (`Runtime.parallelize`: the TP plan slices the empty model), then filled one tensor at a
time: each TP rank reads only its rows or columns straight from the shard (``get_slice``), so the host never holds a
full-precision copy. The layouts are in checkpoint_formats.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from ..checkpoint_io import (
    RANDOM_WEIGHTS,
    ShardedCheckpoint,
    check_keys,
    fill_random,
    finish_loading,
    list_shards,
    load_tensors,
)
from .checkpoint_formats import LayoutError, TransformerLayout, decide_qkv_layout, is_diffusers_layout, read_class_name
from .config import MiniMaxH3Config, MiniMaxH3ConfigError
from .dit import FP32_BUFFER_NAMES, FP32_PARAMETER_NAMES, MiniMaxH3DiT

log = logging.getLogger(__name__)

INDEX_NAMES = ("model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json")
# Recomputable from the config, so a checkpoint may omit it (the release ships it; diffusers drops it).
OPTIONAL_KEYS = frozenset(FP32_BUFFER_NAMES)


class CheckpointError(RuntimeError):
    """The path does not hold a loadable MiniMax H3 transformer."""


def target_dtype(key: str, dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if key in FP32_PARAMETER_NAMES or key in FP32_BUFFER_NAMES else dtype


# -- locating the files ---------------------------------------------------------------------------------------------
def find_transformer_dir(path: str | Path) -> Path:
    path = Path(path)
    for candidate in (path, path / "transformer"):
        if (candidate / "config.json").is_file():
            return candidate
    hint = ""
    partitions = [p for p in ("FL2VA", "Ref2VA") if (path / p / "transformer").is_dir()] if path.is_dir() else []
    if partitions:
        hint = f"; this looks like the release root, pass {path / partitions[0]} (partitions: {', '.join(partitions)})"
    raise CheckpointError(f"no MiniMax H3 transformer at {path}: expected config.json there or in transformer/{hint}")


def find_shards(directory: Path) -> tuple[list[Path], Path | None]:
    """The shards of `directory` and the index that named them (None when they were globbed)."""
    shards = list_shards(directory, index_names=INDEX_NAMES, pattern="*.safetensors", error=CheckpointError)
    if not shards:
        raise CheckpointError(f"no safetensors shards in {directory} (expected {' or '.join(INDEX_NAMES)})")
    index = next((directory / n for n in INDEX_NAMES if (directory / n).is_file()), None)
    return shards, index


def _read_config(directory: Path | None, diffusers: bool) -> MiniMaxH3Config:
    try:
        if directory is None:
            return MiniMaxH3Config()  # a single file carries no config: the released architecture (shape-checked)
        if diffusers:
            path = directory / "config.json"
            return MiniMaxH3Config.from_diffusers_dict(json.loads(path.read_text(encoding="utf-8")), source=str(path))
        return MiniMaxH3Config.from_json(directory / "config.json")
    except MiniMaxH3ConfigError as exc:
        raise CheckpointError(str(exc)) from exc


def _index_metadata(index: Path | None) -> dict[str, str]:
    if index is None:
        return {}
    meta = json.loads(index.read_text(encoding="utf-8")).get("metadata") or {}
    return {k: str(v) for k, v in meta.items() if isinstance(v, str)}


def read_transformer_config(path: str | Path) -> MiniMaxH3Config:
    """The config of the transformer checkpoint at `path` (its folder or a single file), without reading a weight."""
    files = _Files.locate(path)
    with ShardedCheckpoint(files.shards) as checkpoint:
        class_name = read_class_name(files.directory / "config.json") if files.directory is not None else None
        return _read_config(files.directory, is_diffusers_layout(checkpoint.keys(), class_name))


# -- loading ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Files:
    """Where a transformer's tensors are: its folder (None for a single file), shards and shard index."""

    where: str
    directory: Path | None
    shards: list[Path]
    index: Path | None

    @classmethod
    def locate(cls, path: str | Path) -> _Files:
        path = Path(path)
        if path.is_file():
            return cls(str(path), None, [path], None)
        directory = find_transformer_dir(path)
        shards, index = find_shards(directory)
        return cls(str(directory), directory, shards, index)


def load_minimax_h3_dit(
    path: str | Path,
    *,
    device: str | torch.device,
    dtype: torch.dtype = torch.bfloat16,
    attn_impl: str = "sdpa",
    qkv_layout: str | None = None,
    parallelize: Callable[[MiniMaxH3DiT], MiniMaxH3DiT] | None = None,
    after_block: Callable[[MiniMaxH3DiT, int], None] | None = None,
) -> MiniMaxH3DiT:
    """Load a transformer checkpoint onto `device`: `dtype` for the blocks, fp32 for the released fp32 modules.
    `qkv_layout` ("interleaved" | "stacked") says how a release-named file orders its fused QKV rows when neither
    its metadata nor the released shard index does. `parallelize` (`Runtime.parallelize`) runs on the empty model
    before any tensor is read, so that each TP rank reads only its slices. `after_block(model, i)` runs as soon as
    block i is loaded (to quantize it or move it to host memory before the next one arrives)."""
    files = _Files.locate(path)
    device = torch.device(device)
    with ShardedCheckpoint(files.shards) as checkpoint:
        kind, config, layout_name, why = _identify(files, checkpoint, qkv_layout)
        with torch.device("meta"):
            model = MiniMaxH3DiT(config, attn_impl=attn_impl)
        full_shapes = {k: tuple(t.shape) for k, t in model.state_dict().items()}
        if parallelize is not None:
            model = parallelize(model)
        tp = model.tensor_parallel
        layout = TransformerLayout(kind, layout_name, config, tp.rank if tp else 0, tp.size if tp else 1)
        finish = None if after_block is None else partial(after_block, model)
        absent = _read_tensors(
            model, checkpoint, layout, full_shapes, files.where, device=device, dtype=dtype, after_block=finish
        )
        model.checkpoint_bytes_read = checkpoint.bytes_read  # this rank's share only, under TP
    if "rope.inv_freq" in absent:
        model.rope.inv_freq = _rope_inv_freq(config, device)
    finish_loading(model, f"checkpoint {files.where}", error=CheckpointError)
    model.checkpoint_layout = f"{layout.kind}" + (f", qkv {layout_name} ({why})" if layout_name else "")
    log.info(
        "MiniMax H3 DiT loaded from %s (%s; %d shards, %.2f GiB read on this rank, %s, tp=%d)",
        files.where,
        model.checkpoint_layout,
        len(files.shards),
        model.checkpoint_bytes_read / 2**30,
        dtype,
        layout.tp_size,
    )
    return model


def _identify(
    files: _Files, checkpoint: ShardedCheckpoint, qkv_layout: str | None
) -> tuple[str, MiniMaxH3Config, str | None, str]:
    """(layout kind, config, release QKV row order or None, why that order) from the files' names and metadata."""
    class_name = read_class_name(files.directory / "config.json") if files.directory is not None else None
    diffusers = is_diffusers_layout(checkpoint.keys(), class_name)
    config = _read_config(files.directory, diffusers)
    if diffusers:
        return "diffusers", config, None, "diffusers layout"
    metadata = {**_index_metadata(files.index), **checkpoint.metadata()}
    try:
        name, why = decide_qkv_layout(
            qkv_layout, metadata, index=files.index, shards=files.shards, class_name=class_name
        )
    except LayoutError as exc:
        raise CheckpointError(str(exc)) from exc
    return "release", config, name, why


def _read_tensors(
    model: MiniMaxH3DiT,
    checkpoint: ShardedCheckpoint,
    layout: TransformerLayout,
    full_shapes: dict[str, tuple[int, ...]],
    where: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    after_block: Callable[[int], None] | None = None,
) -> set[str]:
    """Fill every tensor of the (possibly TP-sliced) meta `model` with this rank's part; returns the optional
    (recomputable) keys the checkpoint lacks, left for the caller."""
    expected = model.state_dict(keep_vars=True)
    recipes = {key: layout.recipe(key, full_shapes[key]) for key in expected}
    needed = {name for recipe in recipes.values() for name, _ in recipe.parts}
    optional = {name for key in OPTIONAL_KEYS for name, _ in recipes[key].parts}
    found = checkpoint.keys()
    check_keys(
        needed,
        found,
        Path(where),
        model_label=f"MiniMax H3 DiT ({layout.kind} layout)",
        error=CheckpointError,
        optional=frozenset(optional),
    )
    # only the optional (recomputable) tensors can be absent once check_keys has passed
    absent = {key for key, recipe in recipes.items() if any(name not in found for name, _ in recipe.parts)}

    def produce(key: str) -> torch.Tensor:
        recipe = recipes[key]
        want = layout.source_shape(key, full_shapes[key])
        parts = []
        for name, index in recipe.parts:
            shape = checkpoint.shape(name)
            if shape != want:
                raise CheckpointError(
                    f"{checkpoint.where(name).name}: {name} has shape {shape}, the config expects {want}"
                )
            parts.append(checkpoint.read(name, index))
        tensor = parts[0] if len(parts) == 1 else torch.cat(parts)
        return recipe.finish(tensor) if recipe.finish is not None else tensor

    load_tensors(
        model,
        {k: v for k, v in expected.items() if k not in absent},
        produce,
        device=device,
        dtype_for=partial(target_dtype, dtype=dtype),
        error=CheckpointError,
        source=where,
        after_block=after_block,
    )
    return absent


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
    after_block: Callable[[MiniMaxH3DiT, int], None] | None = None,
) -> MiniMaxH3DiT:
    """A DiT with seeded random weights, identical on every rank and device for the same seed and config.

    `init_on_device=True` draws the numbers with the target device's generator instead of the CPU's: minutes faster
    for the 62 GB official model on a GPU, identical across ranks, but not equal to the CPU draw. `after_block(model,
    i)` runs as soon as block i is drawn (dense weights: call it after a TP split instead).

    Linear weights ~ N(0, 1/fan_in) keep activations O(1) through the stack; biases and the deviation of norm
    weights from 1 are small; the AdaLN projections are random too (the release zero-initialises them for
    training), so every path of the model is exercised."""
    device = torch.device(device)
    with torch.device("meta"):
        model = MiniMaxH3DiT(config, attn_impl=attn_impl)
    fill_random(
        model,
        seed,
        device=device,
        dtype_for=partial(target_dtype, dtype=dtype),
        init_on_device=init_on_device,
        after_block=None if after_block is None else partial(after_block, model),
    )
    model.rope.inv_freq = _rope_inv_freq(config, device)
    finish_loading(model, RANDOM_WEIGHTS, error=CheckpointError)
    log.warning("MiniMax H3 DiT: random weights (no checkpoint), seed %d -- outputs are meaningless", seed)
    return model
