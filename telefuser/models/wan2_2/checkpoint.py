"""Loading Wan 2.2's DiT experts from either release layout, or building seeded random ones.

    original (Wan-AI/Wan2.2-T2V-A14B)     high_noise_model/ and low_noise_model/, each config.json + shards
    original (Wan-AI/Wan2.2-TI2V-5B)      config.json + shards at the root
    diffusers (...-Diffusers)             model_index.json; transformer/ (high noise) and transformer_2/ (low noise)

Each expert is built on the meta device and filled one tensor at a time in its target device and dtype
(`models.wan.checkpoint`); tensors in diffusers' names are mapped with diffusers' own Wan converter.
`write_wan22_expert` writes a model back as one original expert folder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from ..checkpoint_io import list_shards, locate_keys
from ..wan.checkpoint import (
    INDEX_NAMES,
    file_names_to_ours,
    fill_random_weights,
    has_weights,
    is_diffusers_layout,
    load_named_shards,
    write_original_layout,
)
from .config import Wan22Config, Wan22ConfigError
from .dit import Wan22DiT

log = logging.getLogger(__name__)

ORIGINAL_EXPERTS = ("high_noise_model", "low_noise_model")
DIFFUSERS_EXPERTS = ("transformer", "transformer_2")
AfterBlock = Callable[[Wan22DiT, int], None]


class CheckpointError(RuntimeError):
    """The folder does not hold loadable Wan 2.2 DiT weights."""


def expert_dirs(root: str | Path, experts: int) -> list[Path]:
    """The weight folders of the `experts` DiTs (high noise first) in a release root of either layout."""
    root = Path(root).expanduser()
    diffusers = (root / "model_index.json").is_file()
    names = DIFFUSERS_EXPERTS if diffusers else ORIGINAL_EXPERTS
    if experts == 1:
        names = ("transformer",) if diffusers else (".",)
    dirs = [root / name for name in names[:experts]]
    missing = [str(d) for d in dirs if not has_weights(d)]
    if missing:
        layout = "diffusers" if diffusers else "original"
        raise CheckpointError(
            f"{root} ({layout} layout) lacks Wan 2.2 DiT weights for {experts} expert(s): no safetensors in "
            + ", ".join(missing)
        )
    return [d.resolve() for d in dirs]


def boundary_ratio(root: str | Path) -> float | None:
    """The expert boundary a diffusers release declares in ``model_index.json`` (None elsewhere, or undeclared)."""
    index = Path(root).expanduser() / "model_index.json"
    if not index.is_file():
        return None
    value = json.loads(index.read_text(encoding="utf-8")).get("boundary_ratio")
    return None if value is None else float(value)


def load_wan22_dit(
    path: str | Path,
    *,
    device: str | torch.device,
    dtype: torch.dtype = torch.bfloat16,
    attn_impl: str = "sdpa",
    after_block: AfterBlock | None = None,
) -> Wan22DiT:
    """One expert from its folder (config.json beside the shards, either tensor naming) onto `device`: `dtype` for
    the blocks, fp32 for the time embedding, modulation tables and head. The model comes back dense:
    `Runtime.parallelize` splits it. `after_block(model, i)` runs as soon as block i is loaded."""
    weights_dir = Path(path).expanduser()
    config_path = weights_dir / "config.json"
    try:
        config = Wan22Config.from_json(config_path)
    except Wan22ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    shards = list_shards(weights_dir, index_names=INDEX_NAMES, pattern="*.safetensors", error=CheckpointError)
    found = locate_keys(shards)
    with torch.device("meta"):
        model = Wan22DiT(config, attn_impl=attn_impl)
    diffusers = is_diffusers_layout(set(found), weights_dir, error=CheckpointError, title="a Wan 2.2 T2V/TI2V DiT")
    ours = file_names_to_ours(list(model.state_dict(keep_vars=True)), diffusers, CheckpointError)
    load_named_shards(
        model,
        ours,
        shards,
        set(found),
        weights_dir,
        device=torch.device(device),
        dtype=dtype,
        error=CheckpointError,
        label="Wan 2.2 DiT",
        after_block=after_block,
    )
    names = "diffusers'" if diffusers else "original"
    log.info("Wan 2.2 DiT loaded from %s (%d shards, %s tensor names, %s)", weights_dir, len(shards), names, dtype)
    return model


def build_random_wan22_dit(
    config: Wan22Config,
    seed: int,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    attn_impl: str = "sdpa",
    init_on_device: bool = False,
    after_block: AfterBlock | None = None,
) -> Wan22DiT:
    """A DiT with seeded random weights, identical on every rank for the same seed, config and generator device
    (`init_on_device` draws with the device's generator: faster on a GPU, not equal to the CPU draw). For wiring and
    parity tests only: the outputs mean nothing."""
    with torch.device("meta"):
        model = Wan22DiT(config, attn_impl=attn_impl)
    fill_random_weights(
        model,
        seed,
        device=torch.device(device),
        dtype=dtype,
        init_on_device=init_on_device,
        error=CheckpointError,
        after_block=after_block,
    )
    log.warning("Wan 2.2 DiT: random weights (no checkpoint), seed %d -- outputs are meaningless", seed)
    return model


def write_wan22_expert(model: Wan22DiT, directory: str | Path) -> Path:
    """`model` (dense) as one expert folder of the original release: ``config.json`` in the original keys (the
    release's class name; RoPE's base is not a config key there) beside sharded safetensors and their index.
    `load_wan22_dit(directory)` reads it back bit for bit."""
    config = {"_class_name": "WanModel", **model.config.to_dict()}
    config.pop("rope_theta")
    return write_original_layout(model, Path(directory), config)
