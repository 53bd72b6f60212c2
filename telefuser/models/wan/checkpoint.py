"""Wan checkpoint names: the two tensor layouts (the original release's and diffusers'), what the released model keeps
in fp32, and the steps every Wan DiT loader shares (names mapped, keys checked, shards read one tensor at a time onto
a meta-built model; or seeded random weights), and writing a model back in the original layout.

Our modules carry the original names; diffusers' names are mapped with diffusers' own Wan converter run on ours.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import nn

from ..checkpoint_io import (
    RANDOM_WEIGHTS,
    check_keys,
    few,
    fill_random,
    finish_loading,
    load_shards,
    random_tensor,
    standard_normal,
)
from ..shard_writer import write_shards

INDEX_NAMES = ("diffusion_pytorch_model.safetensors.index.json", "model.safetensors.index.json")
DIFFUSERS_MARKERS = ("condition_embedder.", ".attn1.", ".attn2.", "scale_shift_table", "proj_out.")
ORIGINAL_MARKERS = ("text_embedding.", "time_projection.", ".self_attn.", ".cross_attn.", "head.head.")
# Wan 2.1 I2V's image branch, in either layout: the CLIP image embedder and cross-attention's image K/V.
IMAGE_BRANCH_PREFIXES = ("img_emb.", "condition_embedder.image_embedder.")
IMAGE_BRANCH_PARTS = (".k_img.", ".v_img.", ".norm_k_img.", ".add_k_proj.", ".add_v_proj.", ".norm_added_k.")


def keeps_fp32(name: str) -> bool:
    """Parameters the released model computes in fp32 (its autocast(float32) regions): the time embedding and
    projection, every modulation table, and the output head."""
    return name.startswith(("time_embedding.", "time_projection.", "head.")) or name.endswith("modulation")


def target_dtype(key: str, dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if keeps_fp32(key) else dtype


def has_weights(directory: Path) -> bool:
    return directory.is_dir() and (
        any((directory / n).is_file() for n in INDEX_NAMES) or any(directory.glob("*.safetensors"))
    )


# -- tensor names ---------------------------------------------------------------------------------------------------
def diffusers_names(names: list[str], error: type[Exception] = ValueError) -> dict[str, str]:
    """Our (original) tensor name -> diffusers' ``WanTransformer3DModel`` name, by diffusers' own Wan converter run on
    the names (names it has no rule for, such as LingBot's camera layers, come back unchanged)."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    converted = convert_wan_transformer_to_diffusers({name: name for name in names})
    ours = {original: theirs for theirs, original in converted.items()}
    if len(ours) != len(names) or len(converted) != len(names):
        raise error("diffusers' Wan converter does not map this model's tensor names one to one")
    return ours


def is_diffusers_layout(
    keys: set[str], source: Path, *, error: type[Exception], title: str, image_note: str = ""
) -> bool:
    """Whether the file's tensor names are diffusers'; refuses by name a Wan 2.1 I2V image branch and a file that
    mixes both layouts."""
    image = sorted(k for k in keys if k.startswith(IMAGE_BRANCH_PREFIXES) or any(p in k for p in IMAGE_BRANCH_PARTS))
    if image:
        raise error(
            f"{source} has a CLIP image branch ({few(image, 3)}): a Wan 2.1 I2V transformer, not {title}{image_note}"
        )
    diffusers = sorted(k for k in keys if any(marker in k for marker in DIFFUSERS_MARKERS))
    original = sorted(k for k in keys if any(marker in k for marker in ORIGINAL_MARKERS))
    if diffusers and original:
        raise error(
            f"{source} mixes diffusers' Wan tensor names ({few(diffusers, 2)}) with the original ones "
            f"({few(original, 2)}); a checkpoint must use one layout"
        )
    return bool(diffusers)


def file_names_to_ours(ours: list[str], diffusers: bool, error: type[Exception] = ValueError) -> dict[str, str]:
    """File tensor name -> our name, for the layout `is_diffusers_layout` found."""
    if not diffusers:
        return {name: name for name in ours}
    return {theirs: name for name, theirs in diffusers_names(ours, error).items()}


class _AssignByOurNames:
    """`load_shards` assigns each tensor under the file's name; this hands it to the model under ours."""

    def __init__(self, model: nn.Module, ours: dict[str, str]):
        self.model, self.ours = model, ours

    def load_state_dict(self, state: dict, *, strict: bool, assign: bool):
        return self.model.load_state_dict({self.ours[k]: v for k, v in state.items()}, strict=strict, assign=assign)


# -- loading and random weights -------------------------------------------------------------------------------------
def load_named_shards(
    model: nn.Module,
    ours: dict[str, str],
    shards: list[Path],
    found: set[str],
    weights_dir: Path,
    *,
    device: torch.device,
    dtype: torch.dtype,
    error: type[Exception],
    label: str,
    after_block: Callable[[nn.Module, int], None] | None = None,
) -> None:
    """Fill the meta-built `model` from `shards` (file name -> ours in `ours`): the keys checked against the model's
    first, then one tensor at a time onto `device` in `dtype` (fp32 where `keeps_fp32`); `after_block(model, i)` as
    soon as block i is complete."""
    meta = model.state_dict(keep_vars=True)
    expected = {theirs: meta[name] for theirs, name in ours.items()}
    check_keys(set(expected), found, weights_dir, model_label=label, error=error)
    load_shards(
        _AssignByOurNames(model, ours),
        shards,
        expected,
        device=device,
        dtype_for=lambda key: target_dtype(ours[key], dtype),
        error=error,
        after_block=None if after_block is None else partial(after_block, model),
        model_name=ours.__getitem__,
    )
    finish_loading(model, f"checkpoint {weights_dir}", error=error)


def fill_random_weights(
    model: nn.Module,
    seed: int,
    *,
    device: torch.device,
    dtype: torch.dtype,
    init_on_device: bool,
    error: type[Exception],
    after_block: Callable[[nn.Module, int], None] | None = None,
) -> None:
    """Seeded random weights for the meta-built `model`, identical on every rank for the same seed and generator
    device: linears ~ N(0, 1/fan_in), small biases, norm scales near 1, modulation tables ~ N(0, 1/dim) as in the
    release's init, and a non-zero head (the release zero-initialises it for training), so every path is
    exercised."""
    fill_random(
        model,
        seed,
        device=device,
        dtype_for=partial(target_dtype, dtype=dtype),
        init_on_device=init_on_device,
        draw=_random_tensor,
        after_block=None if after_block is None else partial(after_block, model),
    )
    finish_loading(model, RANDOM_WEIGHTS, error=error)


# -- writing ----------------------------------------------------------------------------------------------------------
def write_original_layout(
    model: nn.Module,
    weights_dir: Path,
    config: dict,
    *,
    config_dir: Path | None = None,
    shard_stem: str = "diffusion_pytorch_model",
    shards: int = 2,
) -> Path:
    """A dense model's tensors under their original names, as the releases store them: `shards` safetensors files
    ``<shard_stem>-0000i-of-0000N.safetensors`` in `weights_dir` with the index the loaders look for, and `config`
    as ``config.json`` in `config_dir` (default: beside the shards). Tensors keep their dtypes. Returns
    `weights_dir`."""
    weights_dir = Path(weights_dir)
    weights_dir.mkdir(parents=True, exist_ok=True)
    (Path(config_dir or weights_dir) / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    write_shards(model.state_dict(), weights_dir, stem=shard_stem, index_name=INDEX_NAMES[0], shards=shards)
    return weights_dir


def _random_tensor(name: str, param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Modulation tables ~ N(0, 1/dim) as in the release's init; everything else as `random_tensor`."""
    if name.endswith("modulation"):
        return standard_normal(param, generator) / param.shape[-1] ** 0.5
    return random_tensor(name, param, generator)
