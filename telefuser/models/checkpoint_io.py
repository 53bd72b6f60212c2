"""The model-independent steps of loading a DiT from safetensors shards, or filling it with seeded random weights.

A loader builds on meta, then lists shards, locates and checks keys, streams tensors in one at a time (or reads
slices through `ShardedCheckpoint` when model tensors are not one checkpoint tensor each) and finishes; model
specifics stay in the model's loader, and each helper raises the model's own error class.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

RANDOM_WEIGHTS = "random (no checkpoint)"

DtypeFor = Callable[[str], torch.dtype]  # tensor name -> the dtype it is stored in on the device
Prepare = Callable[[str, torch.Tensor], torch.Tensor]  # (name, tensor as read) -> tensor in the model's layout
Draw = Callable[[str, torch.Tensor, torch.Generator], torch.Tensor]  # (name, meta parameter, generator) -> values
Index = tuple[slice, ...]  # which part of a checkpoint tensor to read: one slice per leading dimension
Produce = Callable[[str], torch.Tensor]  # model tensor name -> its values, read from the checkpoint
AfterBlock = Callable[[int], None]  # called with i once every tensor of ``blocks.<i>`` has been assigned
BLOCK = re.compile(r"^blocks\.(\d+)\.")


class BlockCompletion:
    """Calls `after_block(i)` as soon as every expected tensor of ``blocks.<i>`` has been assigned, in whatever order
    the tensors arrive (shards need not keep a block together), so that a loader can finish each block (quantize it,
    move it to host memory) while the next ones load: the device holds few unfinished blocks."""

    def __init__(self, names: Iterable[str], after_block: AfterBlock | None):
        self.after_block = after_block
        self.remaining: dict[int, int] = {}
        for name in names:
            match = BLOCK.match(name)
            if match:
                index = int(match.group(1))
                self.remaining[index] = self.remaining.get(index, 0) + 1

    def done(self, name: str) -> None:
        match = BLOCK.match(name)
        if match is None or self.after_block is None:
            return
        index = int(match.group(1))
        self.remaining[index] -= 1
        if self.remaining[index] == 0:
            self.after_block(index)


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


class ShardedCheckpoint:
    """The tensors of a set of safetensors shards by name. Headers are read up front; a shard is opened (memory
    mapped) the first time one of its tensors is read and stays open until `close()`. `read` copies only the part
    of a tensor it is asked for, and `bytes_read` counts what was copied."""

    def __init__(self, shards: Iterable[Path]):
        self.shards = list(shards)
        self._where = locate_keys(self.shards)
        self._files = ExitStack()
        self._open: dict[Path, object] = {}
        self.bytes_read = 0

    def __enter__(self) -> "ShardedCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._files.close()
        self._open.clear()

    def keys(self) -> set[str]:
        return set(self._where)

    def where(self, key: str) -> Path:
        return self._where[key]

    def _handle(self, key: str):
        shard = self._where[key]
        if shard not in self._open:
            self._open[shard] = self._files.enter_context(safe_open(str(shard), framework="pt", device="cpu"))
        return self._open[shard]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(key).get_slice(key).get_shape())

    def read(self, key: str, index: Index | None = None) -> torch.Tensor:
        """The whole tensor, or only `index` of it (e.g. ``(slice(a, b),)`` for rows a..b, ``(slice(None),
        slice(c, d))`` for columns c..d): the rest is never copied out of the file."""
        handle = self._handle(key)
        tensor = handle.get_tensor(key) if index is None else handle.get_slice(key)[index]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def metadata(self) -> dict[str, str]:
        """The ``__metadata__`` of every shard, merged (later shards win on a conflicting key)."""
        merged: dict[str, str] = {}
        for shard in self.shards:
            with safe_open(str(shard), framework="pt") as f:
                merged.update(f.metadata() or {})
        return merged


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
    after_block: AfterBlock | None = None,
    model_name: Callable[[str], str] = str,
) -> None:
    """Assign every tensor of the shards into `model`, one at a time: read on the host (memory mapped), `prepare`d
    into the model's layout, shape-checked against `expected` (the meta state dict), moved to `device` in its
    dtype. The host never holds more than one tensor. `after_block(i)` runs once block i is complete, its tensors
    named by `model_name(key)` (`BlockCompletion`)."""
    blocks = BlockCompletion((model_name(k) for k in expected), after_block)
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
                blocks.done(model_name(key))


def load_tensors(
    model: nn.Module,
    expected: dict[str, torch.Tensor],
    produce: Produce,
    *,
    device: torch.device,
    dtype_for: DtypeFor,
    error: type[Exception],
    source: str = "checkpoint",
    after_block: AfterBlock | None = None,
) -> None:
    """Assign every tensor of `expected` (the meta state dict, less what the caller fills itself) into `model`, one
    at a time: `produce(name)` reads it from the checkpoint in the model's layout (already sliced for TP), it is
    shape-checked, moved to `device` in its dtype and assigned. The host holds one tensor (or slice) at a time.
    `after_block(i)` runs once block i is complete (`BlockCompletion`)."""
    blocks = BlockCompletion(expected, after_block)
    for key, meta in expected.items():
        tensor = produce(key)
        if tuple(tensor.shape) != tuple(meta.shape):
            raise error(f"{source}: {key} has shape {tuple(tensor.shape)}, the config expects {tuple(meta.shape)}")
        model.load_state_dict({key: tensor.to(device=device, dtype=dtype_for(key))}, strict=False, assign=True)
        del tensor
        blocks.done(key)


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
    after_block: AfterBlock | None = None,
) -> None:
    """Assign seeded random values to every parameter of the meta-built `model`. The numbers come from a CPU
    generator (the same on every rank and device), or with `init_on_device` from `device`'s (much faster for a
    large model on a GPU, the same on every rank, not equal to the CPU draw). `after_block(i)` runs once block i
    is complete (`BlockCompletion`)."""
    generator = torch.Generator(device if init_on_device else "cpu").manual_seed(seed)
    named = list(model.named_parameters())
    blocks = BlockCompletion((name for name, _ in named), after_block)
    for name, param in named:
        model.load_state_dict(
            {name: draw(name, param, generator).to(device, dtype_for(name))}, strict=False, assign=True
        )
        blocks.done(name)


def finish_loading(model: nn.Module, source: str, *, error: type[Exception]) -> None:
    """No tensor may be left on the meta device; then the model is frozen for inference and says where its weights
    came from (`model.weights_source`)."""
    still_meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if still_meta:
        raise error(f"{source}: tensors left unloaded: {few(still_meta)}")
    model.requires_grad_(False)
    model.eval()
    model.weights_source = source
