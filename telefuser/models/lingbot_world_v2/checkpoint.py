"""Loading the LingBot-World v2 causal-fast transformer (original or diffusers layout), or building a seeded random one.

The model is built on the meta device and filled one tensor at a time in its target device and dtype, so the host
never holds more than one tensor. The layouts it accepts and what it refuses are in this folder's README.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from ..checkpoint_io import list_shards, locate_keys
from ..wan.checkpoint import (
    INDEX_NAMES,
    file_names_to_ours,
    fill_random_weights,
    has_weights,
    is_diffusers_layout,
    load_named_shards,
)
from .config import CAMERA_CHANNELS, VAE_STRIDE_PIXELS, LingBotConfigError, LingBotWorldV2Config
from .dit import LingBotWorldV2DiT

log = logging.getLogger(__name__)

WEIGHT_DIR_NAMES = ("transformers", "transformer")
CAMERA_KEY = "patch_embedding_wancamctrl.weight"
# The streaming window the v2 pipeline runs (config.json describes training and may say -1 = unbounded).
V2_LOCAL_ATTN_SIZE, V2_SINK_SIZE = 18, 6
_CAMERA_MODULES = (
    "patch_embedding_wancamctrl.",
    "c2ws_hidden_states_layer",
    ".cam_injector_layer",
    ".cam_scale_layer.",
    ".cam_shift_layer.",
)


class CheckpointError(RuntimeError):
    """The directory does not hold a loadable LingBot-World v2 transformer."""


# -- locating the files ---------------------------------------------------------------------------------------------
def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(weights directory, config.json) for the model root or the weights directory itself."""
    path = Path(path).expanduser()
    candidates = [path] + [path / name for name in WEIGHT_DIR_NAMES]
    weights = next((c for c in candidates if has_weights(c)), None)
    if weights is None:
        raise CheckpointError(
            f"no LingBot transformer weights at {path}: expected safetensors shards there or in "
            f"{'/ or '.join(WEIGHT_DIR_NAMES)}/"
        )
    config = next((c / "config.json" for c in (weights, weights.parent) if (c / "config.json").is_file()), None)
    if config is None:
        raise CheckpointError(f"no config.json in {weights} or {weights.parent}")
    return weights, config


# -- tensor names ---------------------------------------------------------------------------------------------------
def file_names_to_lingbot(keys: set[str], ours: list[str], source: Path) -> dict[str, str]:
    """File tensor name -> our name, for either layout; refuses by name what cannot map onto LingBot-World v2."""
    diffusers = is_diffusers_layout(
        keys,
        source,
        error=CheckpointError,
        title="LingBot-World v2",
        image_note=" (which conditions on the image latent only)",
    )
    if not any(any(marker in k for marker in _CAMERA_MODULES) for k in keys):
        raise CheckpointError(
            f"{source} has no camera layers ({CAMERA_KEY}, c2ws_hidden_states_layer1/2, blocks.N.cam_*): a plain Wan "
            "transformer, not the LingBot-World v2 camera model"
        )
    if diffusers:
        log.info("%s: diffusers' Wan tensor names, mapped with diffusers' Wan converter", source)
    return file_names_to_ours(ours, diffusers, CheckpointError)


# -- checks ---------------------------------------------------------------------------------------------------------
def note_declared_window(config_path: Path, local_attn_size: int, sink_size: int) -> None:
    """The diffusers-format LingBot configs declare the window their pipeline streams with (the v2 release: 18
    frames, 9 of them sink, blocks of 3); the window run here is the loader's arguments, so say when they differ."""
    payload = json.loads(config_path.read_text(encoding="utf-8"))
    if "sliding_window_num_frames" not in payload:
        return
    window = payload.get("local_attn_size", -1)
    declared = (payload["sliding_window_num_frames"] if window == -1 else window, payload.get("sink_size", 0))
    if declared != (local_attn_size, sink_size):
        log.warning(
            "%s declares a streaming window of %d frames with %d sink frames (blocks of %s frames); running "
            "local_attn_size=%d, sink_size=%d as the loader was asked",
            config_path,
            *declared,
            payload.get("num_frames_per_block", "?"),
            local_attn_size,
            sink_size,
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
    attn_impl: str = "sdpa",
    local_attn_size: int = V2_LOCAL_ATTN_SIZE,
    sink_size: int = V2_SINK_SIZE,
    after_block: Callable[[LingBotWorldV2DiT, int], None] | None = None,
) -> LingBotWorldV2DiT:
    """Load the transformer (original layout or a diffusers-format directory) onto `device`: `dtype` for the
    blocks, fp32 for the time embedding, modulation tables and head. The streaming window comes from the arguments
    (v2: 18 frames, 6 sink), not from config.json. The model comes back dense: `runtime.parallelize` splits it.
    `after_block(model, i)` runs as soon as block i is loaded (to quantize it or move it to host memory)."""
    weights_dir, config_path = find_checkpoint(path)
    try:
        config = LingBotWorldV2Config.from_json(config_path).with_window(local_attn_size, sink_size)
    except LingBotConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    shards = list_shards(weights_dir, index_names=INDEX_NAMES, pattern="*.safetensors", error=CheckpointError)
    device = torch.device(device)

    note_declared_window(config_path, local_attn_size, sink_size)

    found = locate_keys(shards)
    if CAMERA_KEY in found:
        with safe_open(str(found[CAMERA_KEY]), framework="pt") as f:
            check_camera_channels(tuple(f.get_slice(CAMERA_KEY).get_shape()), config)

    with torch.device("meta"):
        model = LingBotWorldV2DiT(config, attn_impl=attn_impl)
    ours = file_names_to_lingbot(set(found), list(model.state_dict(keep_vars=True)), weights_dir)
    load_named_shards(
        model,
        ours,
        shards,
        set(found),
        weights_dir,
        device=device,
        dtype=dtype,
        error=CheckpointError,
        label="LingBot DiT",
        after_block=after_block,
    )
    log.info("LingBot-World v2 DiT loaded from %s (%d shards, %s)", weights_dir, len(shards), dtype)
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
    after_block: Callable[[LingBotWorldV2DiT, int], None] | None = None,
) -> LingBotWorldV2DiT:
    """A DiT with seeded random weights, identical on every rank for the same seed, config and generator device;
    `after_block(model, i)` runs as soon as block i is drawn.

    `init_on_device=True` draws with the target device's generator (much faster for the 14B model on a GPU; not
    equal to the CPU draw). Linear weights ~ N(0, 1/fan_in), small biases, norm scales near 1, modulation tables
    ~ N(0, 1/dim) as in the release's init, and a non-zero head (the release zero-initialises it for training), so
    every path is exercised. For wiring and parity tests only: the outputs mean nothing."""
    device = torch.device(device)
    with torch.device("meta"):
        model = LingBotWorldV2DiT(config, attn_impl=attn_impl)
    fill_random_weights(
        model,
        seed,
        device=device,
        dtype=dtype,
        init_on_device=init_on_device,
        error=CheckpointError,
        after_block=after_block,
    )
    log.warning("LingBot-World v2 DiT: random weights (no checkpoint), seed %d -- outputs are meaningless", seed)
    return model
