"""Assemble a `MiniMaxH3Pipeline` from a checkpoint folder (the release, its ``FL2VA/`` partition or a diffusers
directory) or from random weights.

The layouts are in this folder's README. The VAEs load first (seconds), so a folder with a broken VAE fails before
the 120 GB of DiT and text encoder; the DiT modules are imported inside the functions, so this package imports (and
its tests run) without them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ...ops.fp8 import QUANTIZATIONS
from ...runtime import Runtime
from .pipeline import DEFAULT_TIMESTEP_SCALE, MiniMaxH3Pipeline
from .text_encoder import (
    SELECTED_LAYER,
    MiniMaxH3TextEncoder,
    PromptEncoder,
    official_text_config,
    tiny_text_config,
)
from .tokenizer import load_tokenizer
from .vae import AudioDecoder, VideoDecoder, random_audio_vae, random_video_vae
from .vae_checkpoint import load_audio_vae, load_video_vae

RANDOM = "random (no checkpoint)"
OFFLOADED = ", kept in host memory between prompts"
ADALN_OFFLOADED = ", AdaLN projections kept in host memory, streamed once per request for its tables"
TINY_TEXT_LAYERS = 2


def resolve_partition(checkpoint: str | Path, partition: str = "FL2VA") -> Path:
    """The folder that holds ``transformer/``: ``<root>/<partition>`` or `checkpoint` itself."""
    root = Path(checkpoint)
    for candidate in (root / partition, root):
        if (candidate / "transformer").is_dir():
            return candidate
    raise FileNotFoundError(f"{root} is not a MiniMax H3 checkpoint: no {partition}/transformer or transformer folder")


def _first_dir(part: Path, *names: str) -> Path:
    for name in names:
        if (part / name).is_dir():
            return part / name
    raise FileNotFoundError(f"{part} has no {' or '.join(names)} folder")


def build_minimax_h3_pipeline(
    *,
    config: str = "tiny",
    checkpoint: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    mesh=None,
    seed: int = 0,
    attn_impl: str = "sdpa",
    timestep_scale: float = DEFAULT_TIMESTEP_SCALE,
    show_progress: bool = True,
    offload_text_encoder: bool = False,
    offload_adaln: bool = False,
    qkv_layout: str | None = None,
    quantization: str = "none",
) -> MiniMaxH3Pipeline:
    """`config` picks the random-weight sizes ("tiny" or "official") when `checkpoint` is None.
    `offload_text_encoder` keeps the text encoder in host memory except while it encodes (see `PromptEncoder`).
    `offload_adaln` keeps the DiT's AdaLN projections in (pinned) host memory: each request's tables are computed
    from them, one projection on the device at a time (`MiniMaxH3DiT.offload_adaln`; after TP, this rank's slices).
    `qkv_layout` is passed to the DiT loader (for re-exported single files). `quantization` "fp8" runs the joint
    blocks' GEMMs in FP8 (`MiniMaxH3DiT.quantize`, applied after TP: each rank quantizes its slices)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    pipe = _build(
        config=config,
        checkpoint=checkpoint,
        device=device,
        dtype=dtype,
        mesh=mesh,
        seed=seed,
        attn_impl=attn_impl,
        timestep_scale=timestep_scale,
        show_progress=show_progress,
        offload_text_encoder=offload_text_encoder,
        qkv_layout=qkv_layout,
    )
    pipe.dit.quantize(quantization)
    if offload_adaln:
        moved = pipe.dit.offload_adaln()
        pipe.adaln_tables = True  # an offloaded DiT needs them for every call
        pipe.weights["dit"] = f"{pipe.weights['dit']}{ADALN_OFFLOADED} ({moved / 2**30:.2f} GiB on this rank)"
    return pipe


def pipeline_from_args(args: argparse.Namespace, runtime: Runtime, **overrides) -> MiniMaxH3Pipeline:
    """The pipeline the MiniMax H3 flags in `args` describe (`MINIMAX_H3.flags`; a flag `args` lacks takes its
    default), on `runtime`'s device, dtype and layout; `overrides` are `build_minimax_h3_pipeline` keywords that
    replace or add to those. --attn-impl (auto included) is resolved and agreed by all ranks
    (`MINIMAX_H3.attention_impl`) unless `overrides` names the implementation."""
    from telefuser.models.minimax_h3.spec import MINIMAX_H3

    options = MINIMAX_H3.options(
        args, "config", "checkpoint", "quantization", "offload_text_encoder", "offload_adaln", "qkv_layout"
    )
    if "attn_impl" not in overrides:
        options["attn_impl"] = MINIMAX_H3.attention_impl(args, runtime)
    launch = {"device": runtime.device, "dtype": runtime.dtype, "mesh": runtime.mesh}
    return build_minimax_h3_pipeline(**{**options, **launch, **overrides})


def _build(
    *,
    config,
    checkpoint,
    device,
    dtype,
    mesh,
    seed,
    attn_impl,
    timestep_scale,
    show_progress,
    offload_text_encoder,
    qkv_layout,
) -> MiniMaxH3Pipeline:
    device = torch.device(device)
    if checkpoint is not None:
        return _from_checkpoint(
            Path(checkpoint),
            device=device,
            dtype=dtype,
            mesh=mesh,
            attn_impl=attn_impl,
            timestep_scale=timestep_scale,
            show_progress=show_progress,
            offload_text_encoder=offload_text_encoder,
            qkv_layout=qkv_layout,
        )
    if config not in ("tiny", "official"):
        raise ValueError(f"config must be 'tiny' or 'official', got {config!r}")
    from telefuser.models.minimax_h3.checkpoint import build_random_minimax_h3_dit
    from telefuser.models.minimax_h3.config import MiniMaxH3Config

    dit_config = MiniMaxH3Config.tiny() if config == "tiny" else MiniMaxH3Config()
    if config == "tiny":
        text_config, text_layers = tiny_text_config(hidden_size=int(dit_config.text_dim)), TINY_TEXT_LAYERS
    else:
        text_config, text_layers = official_text_config(), SELECTED_LAYER
    encoder = MiniMaxH3TextEncoder.random(text_config, num_layers=text_layers, seed=seed, device=device, dtype=dtype)
    # on a GPU, draw there: drawing the 33B-parameter official DiT on the host takes minutes
    on_device = device.type == "cuda"
    dit = build_random_minimax_h3_dit(dit_config, seed, device, dtype, attn_impl=attn_impl, init_on_device=on_device)
    Runtime(mesh, device, dtype).parallelize(dit)
    video_vae = random_video_vae(config, seed=seed, device=device, dtype=dtype, init_on_device=on_device)
    audio_vae = random_audio_vae(config, seed=seed, device=device, init_on_device=on_device)
    tokenizer = load_tokenizer(None)
    return MiniMaxH3Pipeline(
        dit,
        PromptEncoder(tokenizer, encoder, offload=offload_text_encoder),
        VideoDecoder(video_vae, f"{video_vae.weights_source}: AutoencoderKLMiniMaxH3 (diffusers)"),
        AudioDecoder(audio_vae, f"{audio_vae.weights_source}: AutoencoderKLMiniMaxH3Audio (diffusers)"),
        device=device,
        patch_size=tuple(dit_config.patch_size),
        timestep_scale=timestep_scale,
        weights={
            "summary": f"{RANDOM}, {config} sizes",
            "dit": getattr(dit, "weights_source", RANDOM),
            "text_encoder": RANDOM + (OFFLOADED if offload_text_encoder else ""),
            "tokenizer": tokenizer.description,
            "video_vae": f"{RANDOM}, {config} sizes (diffusers AutoencoderKLMiniMaxH3)",
            "audio_vae": f"{RANDOM}, {config} sizes (diffusers AutoencoderKLMiniMaxH3Audio)",
        },
        show_progress=show_progress,
    )


def _from_checkpoint(
    checkpoint: Path,
    *,
    device,
    dtype,
    mesh,
    attn_impl,
    timestep_scale,
    show_progress,
    offload_text_encoder: bool,
    qkv_layout: str | None,
) -> MiniMaxH3Pipeline:
    part = resolve_partition(checkpoint)
    video_vae = load_video_vae(_first_dir(part, "video_vae", "vae"), device=device, dtype=dtype)
    audio_vae = load_audio_vae(_first_dir(part, "audio_vae"), device=device)
    from telefuser.models.minimax_h3.checkpoint import load_minimax_h3_dit

    tokenizer_dir = next((part / n for n in ("processor", "tokenizer") if (part / n).is_dir()), None)
    tokenizer = load_tokenizer(tokenizer_dir)
    encoder_device = "cpu" if offload_text_encoder else device  # offloaded: read straight into host memory
    encoder = MiniMaxH3TextEncoder.from_checkpoint(part / "text_encoder", device=encoder_device, dtype=dtype)
    dit = load_minimax_h3_dit(
        part / "transformer",
        device=device,
        dtype=dtype,
        attn_impl=attn_impl,
        qkv_layout=qkv_layout,
        parallelize=Runtime(mesh, device, dtype).parallelize,  # before the read: a TP rank reads only its slices
    )
    config = getattr(dit, "config", None)
    patch_size = tuple(getattr(config, "patch_size", (1, 2, 2)))
    return MiniMaxH3Pipeline(
        dit,
        PromptEncoder(tokenizer, encoder, offload=offload_text_encoder),
        VideoDecoder(video_vae, video_vae.weights_source),
        AudioDecoder(audio_vae, audio_vae.weights_source),
        device=device,
        patch_size=patch_size,
        timestep_scale=timestep_scale,
        weights={
            "summary": str(part),
            "dit": f"{part / 'transformer'} ({getattr(dit, 'checkpoint_layout', 'layout not recorded')})",
            "text_encoder": f"{part / 'text_encoder'} (first {SELECTED_LAYER} language layers)"
            + (OFFLOADED if offload_text_encoder else ""),
            "tokenizer": tokenizer.description,
            "video_vae": video_vae.weights_source,
            "audio_vae": audio_vae.weights_source,
        },
        show_progress=show_progress,
    )
