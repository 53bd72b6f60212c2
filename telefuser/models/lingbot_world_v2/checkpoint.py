"""Loading the official LingBot-World v2 causal-fast transformer, and building a seeded random one.

Layout (``lingbot-world-v2-14b-causal-fast``): ``config.json`` (the `WanModelFast` constructor arguments) in the
model root or in the weights directory, and ``transformers/`` holding safetensors shards
(``model-0000N-of-00008.safetensors``) listed in ``diffusion_pytorch_model.safetensors.index.json`` (or
``model.safetensors.index.json``). Tensor names are the original Wan/LingBot names, equal to this model's state-dict
names (``blocks.N.self_attn.q.weight``, ``patch_embedding_wancamctrl.weight`` ...).

The diffusers-format repository (``robbyant/lingbot-world-v2-14b-causal-fast-diffusers``) renames the Wan part
(``condition_embedder.*``, ``attn1.to_q`` ...) and its camera-module names are not confirmed, so it is refused with
a clear error rather than guessed at.

The model is built on the meta device and filled shard by shard, one tensor at a time, directly in its target
device and dtype; the host never holds more than one tensor.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import torch
from safetensors import safe_open

from ...distributed.mesh import ParallelMesh
from ..checkpoint_io import (
    RANDOM_WEIGHTS,
    check_keys,
    few,
    fill_random,
    finish_loading,
    list_shards,
    load_shards,
    locate_keys,
    random_tensor,
    standard_normal,
)
from .config import CAMERA_CHANNELS, VAE_STRIDE_PIXELS, LingBotConfigError, LingBotWorldV2Config
from .dit import LingBotWorldV2DiT, keeps_fp32

log = logging.getLogger(__name__)

INDEX_NAMES = ("diffusion_pytorch_model.safetensors.index.json", "model.safetensors.index.json")
WEIGHT_DIR_NAMES = ("transformers", "transformer")
CAMERA_KEY = "patch_embedding_wancamctrl.weight"
# The streaming window the v2 pipeline runs (config.json describes training and may say -1 = unbounded).
V2_LOCAL_ATTN_SIZE, V2_SINK_SIZE = 18, 6
_DIFFUSERS_MARKERS = ("condition_embedder.", ".attn1.", ".attn2.", "scale_shift_table", "proj_out.")


class CheckpointError(RuntimeError):
    """The directory does not hold a loadable LingBot-World v2 transformer."""


def target_dtype(key: str, dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if keeps_fp32(key) else dtype


# -- locating the files ---------------------------------------------------------------------------------------------
def _has_weights(directory: Path) -> bool:
    return directory.is_dir() and (any((directory / n).is_file() for n in INDEX_NAMES)
                                   or any(directory.glob("*.safetensors")))


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(weights directory, config.json) for the model root or the weights directory itself."""
    path = Path(path).expanduser()
    candidates = [path] + [path / name for name in WEIGHT_DIR_NAMES]
    weights = next((c for c in candidates if _has_weights(c)), None)
    if weights is None:
        raise CheckpointError(
            f"no LingBot transformer weights at {path}: expected safetensors shards there or in "
            f"{'/ or '.join(WEIGHT_DIR_NAMES)}/"
        )
    config = next((c / "config.json" for c in (weights, weights.parent) if (c / "config.json").is_file()), None)
    if config is None:
        raise CheckpointError(f"no config.json in {weights} or {weights.parent}")
    return weights, config


# -- checks ---------------------------------------------------------------------------------------------------------
def check_layout(keys: set[str], source: Path) -> None:
    diffusers = sorted(k for k in keys if any(marker in k for marker in _DIFFUSERS_MARKERS))
    if diffusers:
        raise CheckpointError(
            f"{source} is a diffusers-format transformer ({few(diffusers, 3)}); only the original LingBot layout "
            "(patch_embedding, blocks.N.self_attn.q, ..., patch_embedding_wancamctrl) is supported"
        )


def check_camera_channels(shape: tuple[int, ...], config: LingBotWorldV2Config) -> None:
    """v2 is the camera model: its control projection reads 6 ray channels x 64 pixels x the patch."""
    per_channel = VAE_STRIDE_PIXELS * config.patch_volume
    if len(shape) != 2 or shape[1] % per_channel:
        raise CheckpointError(f"{CAMERA_KEY} has shape {shape}; expected [dim, {CAMERA_CHANNELS}*{per_channel}]")
    channels = shape[1] // per_channel
    if channels != CAMERA_CHANNELS:
        kind = " (a 7-channel 'act' checkpoint)" if channels == 7 else ""
        raise CheckpointError(
            f"{CAMERA_KEY} reads {channels} control channels{kind}; LingBot-World v2 needs the "
            f"{CAMERA_CHANNELS}-channel camera checkpoint (shape[1] == {CAMERA_CHANNELS * per_channel})"
        )


# -- loading --------------------------------------------------------------------------------------------------------
def load_lingbot_dit(
    path: str | Path,
    *,
    device: str | torch.device,
    dtype: torch.dtype = torch.bfloat16,
    mesh: ParallelMesh | None = None,
    attn_impl: str = "sdpa",
    local_attn_size: int = V2_LOCAL_ATTN_SIZE,
    sink_size: int = V2_SINK_SIZE,
) -> LingBotWorldV2DiT:
    """Load the official transformer onto `device`: `dtype` for the blocks, fp32 for the time embedding,
    modulation tables and head. The streaming window comes from the arguments (v2: 18 frames, 6 sink), not from
    config.json. With a mesh, the model comes back with `enable_parallel(mesh)` applied."""
    weights_dir, config_path = find_checkpoint(path)
    try:
        config = LingBotWorldV2Config.from_json(config_path).with_window(local_attn_size, sink_size)
    except LingBotConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    shards = list_shards(weights_dir, index_names=INDEX_NAMES, pattern="*.safetensors", error=CheckpointError)
    device = torch.device(device)

    found = locate_keys(shards)
    check_layout(set(found), weights_dir)
    if CAMERA_KEY in found:
        with safe_open(str(found[CAMERA_KEY]), framework="pt") as f:
            check_camera_channels(tuple(f.get_slice(CAMERA_KEY).get_shape()), config)

    with torch.device("meta"):
        model = LingBotWorldV2DiT(config, attn_impl=attn_impl)
    expected = model.state_dict(keep_vars=True)
    check_keys(set(expected), set(found), weights_dir, model_label="LingBot DiT", error=CheckpointError)
    load_shards(model, shards, expected, device=device, dtype_for=partial(target_dtype, dtype=dtype),
                error=CheckpointError)
    finish_loading(model, f"checkpoint {weights_dir}", error=CheckpointError)
    log.info("LingBot-World v2 DiT loaded from %s (%d shards, %s)", weights_dir, len(shards), dtype)
    if mesh is not None:
        model.enable_parallel(mesh)
    return model


# -- random weights -------------------------------------------------------------------------------------------------
def build_random_lingbot_dit(
    config: LingBotWorldV2Config,
    seed: int,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    attn_impl: str = "sdpa",
    init_on_device: bool = False,
) -> LingBotWorldV2DiT:
    """A DiT with seeded random weights, identical on every rank for the same seed, config and generator device.

    `init_on_device=True` draws with the target device's generator (much faster for the 14B model on a GPU; not
    equal to the CPU draw). Linear weights ~ N(0, 1/fan_in), small biases, norm scales near 1, modulation tables
    ~ N(0, 1/dim) as in the release's init, and a non-zero head (the release zero-initialises it for training), so
    every path is exercised. For wiring and parity tests only: the outputs mean nothing."""
    device = torch.device(device)
    with torch.device("meta"):
        model = LingBotWorldV2DiT(config, attn_impl=attn_impl)
    fill_random(model, seed, device=device, dtype_for=partial(target_dtype, dtype=dtype),
                init_on_device=init_on_device, draw=_random_tensor)
    finish_loading(model, RANDOM_WEIGHTS, error=CheckpointError)
    log.warning("LingBot-World v2 DiT: random weights (no checkpoint), seed %d -- outputs are meaningless", seed)
    return model


def _random_tensor(name: str, param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Modulation tables ~ N(0, 1/dim) as in the release's init; everything else as `random_tensor`."""
    if name.endswith("modulation"):
        return standard_normal(param, generator) / param.shape[-1] ** 0.5
    return random_tensor(name, param, generator)
