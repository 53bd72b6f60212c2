"""LoRAs for the MiniMax H3 DiT: read a LoRA file as diffusers reads it, merge it into the weights, undo it exactly.

Reading (`read_lora`) goes through diffusers' own `MiniMaxH3LoraLoaderMixin.lora_state_dict`, which knows every
producer's format (ai-toolkit's ``diffusion_model.`` prefix, the reference / ComfyUI names, musubi-tuner's
``lora_unet_``, kohya's ``lora_down``/``lora_up`` with ``alpha`` tensors (folded into the factors), DiffSynth-Studio's
``.default.`` infix over a per-head interleaved QKV, de-interleaved with the release's head dim 128, peft dumps,
files diffusers saved) and its alpha conventions (a ``__metadata__`` ``alpha`` is honored, an alpha-less file loads at
alpha == rank, a diffusers adapter config's patterns resolve as in peft). This module only maps diffusers'
module names back onto this model's (the inverse of `checkpoint_formats.diffusers_name`) and regroups the factors
into this model's fused layouts: ``to_q``/``to_k``/``to_v`` become the Q, K and V rows of ``attn.qkv_proj``, and
diffusers' ``[value; gate]`` SwiGLU input becomes this model's ``[gate; up]`` ``mlp.fc1``. Every factor pair then
satisfies ``delta = up @ down`` with this model's weight shape.

Merging (`merge`) sets, per touched linear, ``W' = (W + sum_i scale_i * (alpha_i / rank_i) * up_i @ down_i)`` in
fp32 on the model's compute device, one weight at a time, cast once to the weight's dtype. Under tensor parallelism
each rank computes only its own slice (tp.tensor_pieces: the rows of ``up`` of a column split, the columns of ``down``
of a row split). An FP8 linear (`ops.fp8.Float8Linear`) is re-quantized from its dense weight + delta, never merged
into its e4m3 codes, so its dense weight must have been kept before quantization (`keep_dense_weights`): the codes
then equal those of quantizing a dense model that had the LoRAs merged first.

Where the copies live: everything this module keeps is in host memory (`memory.host.to_host`, pinned where CUDA
exists), this rank's slices only, on ``model.lora_state``, and kept for the model's life once made, so that switching
LoRA sets copies only from host to device:
* ``dense``: the dense weight of each linear before any LoRA. Made by `keep_dense_weights` for the FP8 linears (every
  merge re-quantizes from it), and by the first reversible `merge` touching a dense linear (or `keep_originals`,
  which a service calls at start-up so that its first merge copies nothing to the host).
* ``codes``: the e4m3 codes and scales of each FP8 linear before any LoRA (made by the first reversible merge
  touching it, or `keep_originals`).
A merge computes from the weight on the device (unmerged, so the original) or, for FP8, from ``dense`` copied to the
device in its own dtype; the fp32 arithmetic runs on the device. `unmerge` copies the originals back (no
subtraction), so the weights are bit-identical to before the merge. `apply` switches from one LoRA set to another
(validate, unmerge, merge), and ``model.lora_state.applied`` / `applied_loras` say what is merged. Merge between
requests: AdaLN tables a request already computed hold the old projections.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import torch
from torch import nn

from ...distributed.tp import Rowwise, TensorParallelState
from ...memory.host import pinning, to_host
from ...ops.fp8 import Float8Linear, quantize_rows
from .checkpoint_formats import diffusers_name
from .tp import style_for, tensor_pieces

log = logging.getLogger(__name__)

# diffusers' component names for the two DiT partitions of the release
PARTITIONS = MappingProxyType({"transformer": "FL2VA", "transformer_ref": "Ref2VA"})

# Every linear layer of the model, what a LoRA may target: these, each joint block's and each refiner block's.
TOP_LINEARS = (
    "video_patch_proj",
    "audio_patch_proj",
    "condition_proj",
    "time_embedder.proj_in",
    "time_embedder.proj_out",
    "final_layer.adaln_proj.linear",
    "final_layer.video_out",
    "final_layer.audio_out",
)
BLOCK_LINEARS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2", "adaln_proj.linear")
REFINER_LINEARS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")
_SHOWN = 5  # how many offending names an error lists


class LoraError(ValueError):
    """A LoRA file that cannot be read for this model, or a merge that cannot be done (nothing was changed)."""


# -- what a LoRA holds -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModuleLora:
    """One linear's low-rank update in this model's layout: ``delta = up @ down`` has the full weight's shape."""

    down: torch.Tensor  # A: [rank, in_features]
    up: torch.Tensor  # B: [out_features, rank], rows in this model's order
    alpha: float

    @property
    def rank(self) -> int:
        return self.down.shape[0]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def shape(self) -> tuple[int, int]:
        return (self.up.shape[0], self.down.shape[1])


@dataclass(frozen=True)
class Lora:
    """A LoRA file read for this model: `modules` maps this model's linear names to their updates."""

    path: str
    partition: str  # the partition its layers were made for ("transformer" FL2VA, "transformer_ref" Ref2VA)
    modules: Mapping[str, ModuleLora]

    @property
    def name(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class AppliedLora:
    """One merged LoRA, as the service reports it."""

    name: str
    path: str
    partition: str
    scale: float
    modules: int


# -- reading ---------------------------------------------------------------------------------------------------------
def read_lora(path: str | Path, *, partition: str = "transformer", allow_other_partition: bool = False) -> Lora:
    """Read the LoRA file at `path` for the `partition` this model runs ("transformer": FL2VA, "transformer_ref":
    Ref2VA) with diffusers' `MiniMaxH3LoraLoaderMixin.lora_state_dict`. A LoRA whose layers name only the other
    partition is refused unless `allow_other_partition` (diffusers' ``load_into_transformer_ref``); a key that maps
    onto no linear layer of this model is refused by name. Shapes are checked against the model by `merge`."""
    if partition not in PARTITIONS:
        raise LoraError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    path = Path(path)
    if not path.is_file():
        raise LoraError(f"no LoRA file at {path}")
    state, metadata = _diffusers_state_dict(path)
    prefix = _choose_partition(state, path, partition, allow_other_partition)
    config = _partition_config(metadata, prefix)
    parts: dict[str, dict[int | None, tuple[torch.Tensor, torch.Tensor, float]]] = {}
    unmatched = []
    for module, (down, up) in _factor_pairs(state, prefix, path).items():
        target = our_module(module)
        if target is None:
            unmatched.append(f"{prefix}.{module}")
            continue
        ours, section = target
        parts.setdefault(ours, {})[section] = (down, up, _alpha(module, down.shape[0], config))
    if unmatched:
        raise LoraError(
            f"{path}: {len(unmatched)} LoRA layer(s) map onto no linear layer of the MiniMax H3 DiT (read as "
            f"diffusers names them): {_few(unmatched)}"
        )
    modules = {name: _assemble(name, parts[name]) for name in sorted(parts)}
    log.info("LoRA %s: %d linear layers of the %s partition", path, len(modules), PARTITIONS[prefix])
    return Lora(str(path), prefix, MappingProxyType(modules))


def _diffusers_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], dict | None]:
    """diffusers' converted state dict (``<partition>.<diffusers module>.lora_{A,B}.weight``) and LoRA config."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            magnitudes = [k for k in handle.keys() if "dora_scale" in k or "lora_magnitude_vector" in k]
    except (OSError, SafetensorError) as exc:
        raise LoraError(f"{path} is not a readable safetensors file: {exc}") from exc
    if magnitudes:  # diffusers drops these with a warning; a merge without them would be wrong
        raise LoraError(f"{path} is a DoRA (it has {_few(magnitudes)}); only plain LoRAs can be merged")
    try:
        return MiniMaxH3LoraLoaderMixin.lora_state_dict(
            str(path), use_safetensors=True, local_files_only=True, return_lora_metadata=True
        )
    except (ValueError, KeyError, OSError) as exc:
        raise LoraError(f"diffusers' MiniMax H3 LoRA reader refused {path}: {exc}") from exc


def _choose_partition(state: Mapping[str, torch.Tensor], path: Path, partition: str, allow_other: bool) -> str:
    """The partition prefix whose layers are read: `partition`'s, or, when the file has only the other's and
    `allow_other`, that one. Keys under neither prefix are refused."""
    stray = [k for k in state if not k.startswith(tuple(f"{p}." for p in PARTITIONS))]
    if stray:
        raise LoraError(f"{path}: keys that diffusers does not read as a MiniMax H3 DiT LoRA: {_few(stray)}")
    present = [p for p in PARTITIONS if any(k.startswith(f"{p}.") for k in state)]
    if not present:
        raise LoraError(f"{path} holds no LoRA layer")
    if partition in present:
        if len(present) > 1:
            log.info("LoRA %s also holds layers for the %s partition; they are not used", path, PARTITIONS[present[1]])
        return partition
    other = present[0]
    if not allow_other:
        raise LoraError(
            f"{path} is a LoRA for the {PARTITIONS[other]} partition (its layers are `{other}.`), but this model runs "
            f"{PARTITIONS[partition]} (`{partition}`): a LoRA merged into the other partition degrades the output. "
            "Pass allow_other_partition=True to merge it anyway."
        )
    log.warning("LoRA %s was made for %s; merging it into %s as asked", path, PARTITIONS[other], PARTITIONS[partition])
    return other


def _partition_config(metadata: Mapping | None, prefix: str) -> dict | None:
    """diffusers' LoRA config (peft `LoraConfig` kwargs) for `prefix`'s layers, or None (alpha == rank)."""
    if not metadata:
        return None
    config = {k[len(prefix) + 1 :]: v for k, v in metadata.items() if k.startswith(f"{prefix}.")}
    return config or None


def _factor_pairs(state: Mapping[str, torch.Tensor], prefix: str, path: Path) -> dict[str, tuple]:
    """diffusers module name -> (lora_A, lora_B) for `prefix`'s layers; anything else is refused by name."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    unknown = []
    for key, tensor in state.items():
        if not key.startswith(f"{prefix}."):
            continue
        module, _, kind = key[len(prefix) + 1 :].rpartition(".lora_")
        if kind in ("A.weight", "B.weight") and tensor.dim() == 2:
            pairs.setdefault(module, {})[kind[0]] = tensor
        else:
            unknown.append(key)
    unknown += [f"{prefix}.{m} (lora_{'B' if 'A' in p else 'A'} missing)" for m, p in pairs.items() if len(p) != 2]
    if unknown:
        raise LoraError(f"{path}: LoRA entries that are not a lora_A/lora_B weight pair: {_few(unknown)}")
    for module, pair in pairs.items():
        if pair["B"].shape[1] != pair["A"].shape[0]:
            raise LoraError(f"{path}: {module} has lora_A {tuple(pair['A'].shape)} but lora_B {tuple(pair['B'].shape)}")
    return {module: (pair["A"], pair["B"]) for module, pair in pairs.items()}


def our_module(diffusers_module: str) -> tuple[str, int | None] | None:
    """(this model's linear, the QKV section 0/1/2 of a ``to_q/to_k/to_v``, else None) for a diffusers module name;
    None when it names no linear of this model."""
    index = re.search(r"\.(\d+)\.", diffusers_module)
    candidates = list(TOP_LINEARS)
    if index is not None:
        candidates += [f"blocks.{index.group(1)}.{name}" for name in BLOCK_LINEARS]
        candidates += [f"token_refiner.blocks.{index.group(1)}.{name}" for name in REFINER_LINEARS]
    for ours in candidates:
        theirs = diffusers_name(f"{ours}.weight").removesuffix(".weight")
        if ours.endswith(".attn.qkv_proj"):
            for section, projection in enumerate("qkv"):
                if theirs.replace(".qkv_proj", f".to_{projection}") == diffusers_module:
                    return ours, section
        elif theirs == diffusers_module:
            return ours, None
    return None


def _alpha(module: str, rank: int, config: Mapping | None) -> float:
    """The alpha peft gives diffusers' `module` under diffusers' LoRA config: an ``alpha_pattern`` entry matched as
    peft's ``get_pattern_key`` does, else ``lora_alpha`` (peft's default 8); no config: alpha == rank."""
    if config is None:
        return float(rank)
    for unsupported in ("use_dora", "use_rslora"):
        if config.get(unsupported):
            raise LoraError(f"the LoRA's config sets {unsupported}: only plain LoRAs can be merged")
    patterns = config.get("alpha_pattern") or {}
    for pattern, alpha in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return float(alpha)
    return float(config.get("lora_alpha", 8))


def _assemble(name: str, parts: Mapping[int | None, tuple[torch.Tensor, torch.Tensor, float]]) -> ModuleLora:
    """One linear's factors in this model's layout, from diffusers' module(s) for it."""
    if None not in parts:
        return _fused_qkv(name, parts)
    down, up, alpha = parts[None]
    if name.endswith(".mlp.fc1"):  # diffusers' [value; gate] rows -> this model's [gate; up]
        if up.shape[0] % 2:
            raise LoraError(f"{name}: a SwiGLU input LoRA with {up.shape[0]} (odd) output rows")
        value, gate = up.chunk(2)
        up = torch.cat([gate, value])
    return ModuleLora(down, up, alpha)


def _fused_qkv(name: str, parts: Mapping[int, tuple[torch.Tensor, torch.Tensor, float]]) -> ModuleLora:
    """``to_q``/``to_k``/``to_v`` updates as one update of the fused ``[Q; K; V]`` rows. Converted files share one
    lora_A (the fused layer's): B rows stack. Otherwise (a LoRA trained on diffusers' separate projections, or one
    missing a projection) B is block-diagonal over the stacked A's, each block carrying its own alpha/rank, and the
    result's alpha is its rank."""
    rows = {up.shape[0] for _, up, _ in parts.values()}
    if len(rows) != 1:
        raise LoraError(f"{name}: to_q/to_k/to_v LoRAs with different output sizes {sorted(rows)}")
    rows = rows.pop()
    (down0, _, alpha0), *others = (parts[s] for s in sorted(parts))
    if len(parts) == 3 and all(torch.equal(d, down0) and a == alpha0 for d, _, a in others):
        return ModuleLora(down0, torch.cat([parts[s][1] for s in range(3)]), alpha0)
    total = sum(down.shape[0] for down, _, _ in parts.values())
    up = torch.zeros(3 * rows, total, dtype=torch.float32)
    downs, column = [], 0
    for section in sorted(parts):
        down, block, alpha = parts[section]
        rank = down.shape[0]
        up[section * rows : (section + 1) * rows, column : column + rank] = block.float() * (alpha / rank)
        downs.append(down.float())
        column += rank
    return ModuleLora(torch.cat(downs), up, float(total))


# -- merging ---------------------------------------------------------------------------------------------------------
@dataclass
class LoraState:
    """What LoRA merging keeps on a model (``model.lora_state``), in host memory, this rank's slices only."""

    dense: dict[str, torch.Tensor] = field(default_factory=dict)  # linear -> its dense weight before any LoRA
    codes: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # FP8 linear -> codes, scale
    touched: list[str] = field(default_factory=list)  # the linears the merged set changed
    applied: tuple[AppliedLora, ...] = ()
    reversible: bool = True


def lora_state(model: nn.Module) -> LoraState:
    """``model.lora_state``, made empty on first use."""
    state = getattr(model, "lora_state", None)
    if state is None:
        state = LoraState()
        model.lora_state = state
    return state


def applied_loras(model: nn.Module) -> tuple[AppliedLora, ...]:
    """The LoRAs merged into `model`, in merge order (empty: none)."""
    state = getattr(model, "lora_state", None)
    return () if state is None else state.applied


@torch.no_grad()
def keep_dense_weights(model: nn.Module, *, blocks: Iterable[int] | None = None) -> int:
    """Keep host copies of the dense weights of `blocks`' FP8 linears (``model.FP8_LINEARS``; default: every
    block), the source `merge` re-quantizes an FP8 linear from. Call it before they are quantized: before
    ``model.quantize("fp8")``, or per block before ``finish_block`` quantizes it. Returns the bytes kept (this
    rank's slices; the bf16 size of those linears when all blocks are kept)."""
    state = lora_state(model)
    if state.applied:
        raise LoraError("keep_dense_weights on a model with LoRAs merged would keep merged weights: unmerge first")
    kept = 0
    for index in range(len(model.blocks)) if blocks is None else blocks:
        for suffix in model.FP8_LINEARS:
            name = f"blocks.{index}.{suffix}"
            if name in state.dense:
                continue
            module = model.get_submodule(name)
            if isinstance(module, Float8Linear):
                raise LoraError(
                    f"{name} is already FP8: its dense weight is gone; keep_dense_weights before quantizing"
                )
            state.dense[name] = _host_copy(module.weight)
            kept += module.weight.numel() * module.weight.element_size()
    return kept


@torch.no_grad()
def keep_originals(model: nn.Module, names: Iterable[str]) -> int:
    """Keep host copies of the linears `names` as they are now (unmerged), what a reversible merge would otherwise
    copy on first touching them: a service calls it at start-up so that merges and switches copy only from host to
    device. Returns the bytes newly kept."""
    state = lora_state(model)
    if state.applied:
        raise LoraError("keep_originals on a model with LoRAs merged would keep merged weights: unmerge first")
    kept = 0
    for name in names:
        module = _linear(model, name)
        if module is None:
            raise LoraError(f"keep_originals: {name} is no linear layer of the model")
        kept += _keep_original(state, name, module)
    return kept


def _keep_original(state: LoraState, name: str, module: nn.Module) -> int:
    """The host copy `unmerge` restores `name` from, made once; the bytes it took (0 when it existed)."""
    if isinstance(module, Float8Linear):
        if name in state.codes:
            return 0
        state.codes[name] = (_host_copy(module.weight), _host_copy(module.weight_scale))
        return sum(t.numel() * t.element_size() for t in state.codes[name])
    if name in state.dense:
        return 0
    state.dense[name] = _host_copy(module.weight)
    return module.weight.numel() * module.weight.element_size()


@torch.no_grad()
def merge(model: nn.Module, loras: Sequence[tuple[Lora, float]], *, reversible: bool = True) -> None:
    """Merge each ``(lora, scale)`` of `loras` into `model`'s weights (see the module docstring for the arithmetic
    and where the copies live). Everything is checked first (every layer exists with the LoRA's shape; FP8 linears
    have their dense weight kept), so a refused merge changes nothing. `reversible=False` keeps no copy of what it
    overwrites (no host memory; `unmerge` is then refused). A model with LoRAs merged must be unmerged first (or use
    `apply`)."""
    state = lora_state(model)
    if state.applied:
        raise LoraError(f"LoRAs are already merged ({_names(state.applied)}): unmerge first, or use apply()")
    terms = [(lora, float(scale)) for lora, scale in loras]
    targets = _targets(model, terms, state)
    state.reversible = reversible
    try:
        for name, module in targets.items():
            state.touched.append(name)
            updates = [(lora.modules[name], s) for lora, s in terms if name in lora.modules]
            _merge_linear(model, name, module, updates, reversible)
    except BaseException:
        if reversible:
            _restore(model, state)  # back to the weights before this call
        raise
    state.applied = tuple(AppliedLora(lora.name, lora.path, lora.partition, s, len(lora.modules)) for lora, s in terms)
    log.info("merged LoRAs %s into %d linear layers", _names(state.applied), len(targets))


@torch.no_grad()
def unmerge(model: nn.Module) -> tuple[AppliedLora, ...]:
    """Restore the weights from before `merge` exactly (the saved copies are copied back); returns what was merged
    (empty when nothing was)."""
    state = getattr(model, "lora_state", None)
    if state is None or not state.applied:
        return ()
    if not state.reversible:
        raise LoraError(f"the LoRAs {_names(state.applied)} were merged with reversible=False: nothing to restore")
    removed = state.applied
    _restore(model, state)
    state.applied = ()
    return removed


def apply(model: nn.Module, loras: Sequence[tuple[Lora, float]], *, reversible: bool = True) -> None:
    """Make `loras` the merged set (an empty list: none), whatever was merged before: the new set is checked
    first, then the old one is unmerged and the new one merged."""
    _targets(model, [(lora, float(scale)) for lora, scale in loras], lora_state(model))
    unmerge(model)
    if loras:
        merge(model, loras, reversible=reversible)


def _targets(model: nn.Module, terms: Sequence[tuple[Lora, float]], state: LoraState) -> dict[str, nn.Module]:
    """Every linear the LoRAs touch, checked before any weight changes (name order)."""
    if getattr(model, "block_stream", None) is not None:
        raise LoraError("the DiT's blocks stream from host memory (stream_blocks): merge LoRAs before streaming them")
    tp = model.tensor_parallel
    targets, problems = {}, []
    for lora, _ in terms:
        for name, update in lora.modules.items():
            module = _linear(model, name)
            if module is None:
                problems.append(f"{name} (no such linear layer in the model)")
            elif update.shape != _full_shape(name, module, tp):
                problems.append(f"{name} (LoRA {update.shape}, weight {_full_shape(name, module, tp)})")
            elif isinstance(module, Float8Linear) and name not in state.dense:
                problems.append(f"{name} (FP8, its dense weight was not kept: keep_dense_weights before quantizing)")
            else:
                targets[name] = module
        if problems:
            raise LoraError(
                f"cannot merge {lora.path}: {len(problems)} layer(s) do not fit the model: {_few(problems)}"
            )
    return dict(sorted(targets.items()))


Updates = Sequence[tuple[ModuleLora, float]]


def _merge_linear(model: nn.Module, name: str, module: nn.Module, updates: Updates, reversible: bool) -> None:
    """One linear's merge: a dense one from its weight on the device (unmerged: the original), an FP8 one from its
    kept dense weight, re-quantized as `Float8Linear` quantizes."""
    state = model.lora_state
    if reversible:
        _keep_original(state, name, module)
    if isinstance(module, Float8Linear):
        merged = _merged_weight(model, name, module, state.dense[name], updates).to(module.compute_dtype)
        codes, scale = quantize_rows(merged)
        module.weight.copy_(codes)
        module.weight_scale.copy_(scale.t())
        return
    module.weight.copy_(_merged_weight(model, name, module, module.weight, updates).to(module.weight.dtype))


def _merged_weight(model: nn.Module, name: str, module: nn.Module, source, updates: Updates) -> torch.Tensor:
    """fp32 ``source + sum scale * (alpha/rank) * up @ down`` for this rank's slice of the weight, computed on the
    model's compute device. `source` crosses to the device in its own dtype and widens there: a host-to-device copy
    that changes dtype converts on the host first (twice the bytes, at host speed)."""
    device, tp = _compute_device(model), model.tensor_parallel
    merged = source.to(device, non_blocking=True).to(torch.float32, copy=True)
    pieces = _local_pieces(name, _full_shape(name, module, tp), tp)
    for update, scale in updates:
        up = update.up.to(device, non_blocking=True).float()
        down = update.down.to(device, non_blocking=True).float()
        start = 0
        for rows, columns in pieces:
            delta = up[rows] @ down[:, columns]
            delta.mul_(scale * update.scale)
            merged[start : start + delta.shape[0]].add_(delta)
            start += delta.shape[0]
    return merged


def _local_pieces(name: str, full_shape: tuple[int, int], tp: TensorParallelState | None) -> list[tuple[slice, slice]]:
    """(rows, columns) of the full weight this rank holds, in its local row order (tp.tensor_pieces)."""
    pieces = tensor_pieces(f"{name}.weight", full_shape, tp.rank, tp.size) if tp is not None else None
    if pieces is None:
        return [(slice(None), slice(None))]
    return [(piece[0], piece[1] if len(piece) > 1 else slice(None)) for piece in pieces]


def _full_shape(name: str, module: nn.Module, tp: TensorParallelState | None) -> tuple[int, int]:
    """The unsplit (out, in) of a linear that may hold only this rank's slice."""
    out_features, in_features = module.out_features, module.in_features
    style = style_for(name) if tp is not None else None
    if style is None:
        return out_features, in_features
    if isinstance(style, Rowwise):
        return out_features, in_features * tp.size
    return out_features * tp.size, in_features


def _restore(model: nn.Module, state: LoraState) -> None:
    """Copy back what the merge overwrote from the originals (which stay for the next merge)."""
    for name in state.touched:
        module = model.get_submodule(name)
        if isinstance(module, Float8Linear):
            if name in state.codes:
                codes, scale = state.codes[name]
                module.weight.copy_(codes, non_blocking=True)
                module.weight_scale.copy_(scale, non_blocking=True)
        elif name in state.dense:
            module.weight.copy_(state.dense[name], non_blocking=True)
    state.touched.clear()


def _linear(model: nn.Module, name: str) -> nn.Module | None:
    try:
        module = model.get_submodule(name)
    except AttributeError:
        return None
    return module if isinstance(module, (nn.Linear, Float8Linear)) else None


def _compute_device(model: nn.Module) -> torch.device:
    """Where the merge arithmetic runs: the device the time embedder (always resident) computes on."""
    return model.time_embedder.proj_in.weight.device


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` in host memory, never the tensor itself (to_host returns a host tensor unchanged)."""
    host = to_host(tensor.detach())
    if host.data_ptr() == tensor.data_ptr():
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinning()).copy_(tensor)
    return host


def _few(items: Sequence[str]) -> str:
    shown = ", ".join(sorted(items)[:_SHOWN])
    return shown + (f" ... ({len(items)} in all)" if len(items) > _SHOWN else "")


def _names(applied: Sequence[AppliedLora]) -> str:
    return ", ".join(f"{a.name} x {a.scale:g}" for a in applied)
