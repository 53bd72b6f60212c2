"""The model-independent steps of loading a DiT from safetensors shards, or filling it with seeded random weights.

A loader builds its model on the meta device and then, with these helpers: lists the shards (`list_shards`), maps
every tensor name to its shard (`locate_keys`), checks the names against the model (`check_keys`), streams the
tensors into the model one at a time (`load_shards`) or draws random ones (`fill_random`), and finally checks that
nothing is left on meta and freezes the model for inference (`finish_loading`).

Each helper raises the error class it is given, so a model package keeps its own ``CheckpointError``; model
specifics (tensor layouts, TP slicing, extra checks, buffers recomputed from the config) stay in the model's loader.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

RANDOM_WEIGHTS = "random (no checkpoint)"

DtypeFor = Callable[[str], torch.dtype]  # tensor name -> the dtype it is stored in on the device
Prepare = Callable[[str, torch.Tensor], torch.Tensor]  # (name, tensor as read) -> tensor in the model's layout
Draw = Callable[[str, torch.Tensor, torch.Generator], torch.Tensor]  # (name, meta parameter, generator) -> values


def few(names: Iterable[str], n: int = 5) -> str:
    """The first `n` names, sorted, and how many more there are: for error messages."""
    names = sorted(names)
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


# -- the files ------------------------------------------------------------------------------------------------------
def list_shards(directory: Path, *, index_names: Iterable[str], pattern: str, error: type[Exception]) -> list[Path]:
    """The shards named by the first index file in `index_names` found in `directory` (its ``weight_map``), else
    every file matching `pattern`. An index without a weight_map, or naming files that are not there, is an error;
    the result may be empty when there is no index."""
    index = next((directory / n for n in index_names if (directory / n).is_file()), None)
    if index is not None:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise error(f"{index} has no weight_map")
        shards = sorted({directory / name for name in weight_map.values()})
    else:
        shards = sorted(directory.glob(pattern))
    absent = [s.name for s in shards if not s.is_file()]
    if absent:
        raise error(f"{directory}: the index lists shards that are not there: {', '.join(absent[:5])}")
    return shards


def locate_keys(shards: Iterable[Path]) -> dict[str, Path]:
    """Tensor name -> the shard that holds it (reads the shard headers only)."""
    found: dict[str, Path] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            found.update({key: shard for key in f.keys()})
    return found


# -- checks ---------------------------------------------------------------------------------------------------------
def check_keys(
    expected: set[str],
    found: set[str],
    source: Path,
    *,
    model_label: str,
    error: type[Exception],
    optional: frozenset[str] = frozenset(),
) -> None:
    """The checkpoint's tensor names must be the model's, less the `optional` ones it may omit."""
    missing = expected - found - optional
    unexpected = found - expected
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing: {few(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected: {few(unexpected)}")
        raise error(f"{source} does not match the {model_label} config: " + "; ".join(parts))


# -- filling the model ----------------------------------------------------------------------------------------------
def load_shards(
    model: nn.Module,
    shards: Iterable[Path],
    expected: dict[str, torch.Tensor],
    *,
    device: torch.device,
    dtype_for: DtypeFor,
    error: type[Exception],
    prepare: Prepare | None = None,
) -> None:
    """Assign every tensor of the shards into `model`, one at a time: read on the host (memory mapped), `prepare`d
    into the model's layout, shape-checked against `expected` (the meta state dict), moved to `device` in its
    dtype. The host never holds more than one tensor."""
    for shard in shards:
        with safe_open(str(shard), framework="pt", device="cpu") as f:
            for key in f.keys():
                tensor = f.get_tensor(key)
                if prepare is not None:
                    tensor = prepare(key, tensor)
                if tuple(tensor.shape) != tuple(expected[key].shape):
                    raise error(
                        f"{shard.name}: {key} has shape {tuple(tensor.shape)}, the config expects "
                        f"{tuple(expected[key].shape)}"
                    )
                tensor = tensor.to(device=device, dtype=dtype_for(key))
                model.load_state_dict({key: tensor}, strict=False, assign=True)
                del tensor


def standard_normal(param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """fp32 N(0, 1) values shaped like `param`, drawn on the generator's device."""
    return torch.randn(param.shape, generator=generator, dtype=torch.float32, device=generator.device)


def random_tensor(name: str, param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Small biases, norm scales near 1, and weights ~ N(0, 1/fan_in) (fan-in: every dimension after the first,
    so a Conv3d's is in_channels x kernel volume), which keeps activations O(1) through the stack."""
    noise = standard_normal(param, generator)
    if name.endswith(".bias"):
        return 0.1 * noise
    if param.dim() == 1:  # norm scales
        return 1.0 + 0.1 * noise
    return noise / math.prod(param.shape[1:]) ** 0.5


def fill_random(
    model: nn.Module,
    seed: int,
    *,
    device: torch.device,
    dtype_for: DtypeFor,
    init_on_device: bool = False,
    draw: Draw = random_tensor,
) -> None:
    """Assign seeded random values to every parameter of the meta-built `model`. The numbers come from a CPU
    generator (the same on every rank and device), or with `init_on_device` from `device`'s (much faster for a
    large model on a GPU, the same on every rank, not equal to the CPU draw)."""
    generator = torch.Generator(device if init_on_device else "cpu").manual_seed(seed)
    for name, param in model.named_parameters():
        model.load_state_dict({name: draw(name, param, generator).to(device, dtype_for(name))},
                              strict=False, assign=True)


def finish_loading(model: nn.Module, source: str, *, error: type[Exception]) -> None:
    """No tensor may be left on the meta device; then the model is frozen for inference and says where its weights
    came from (`model.weights_source`)."""
    still_meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if still_meta:
        raise error(f"{source}: tensors left unloaded: {few(still_meta)}")
    model.requires_grad_(False)
    model.eval()
    model.weights_source = source
