"""Assemble a `MiniMaxH3Pipeline` from a checkpoint folder or from random weights.

Checkpoint layout (the unmodified ``MiniMaxAI/MiniMax-H3`` release; either the repository root holding
``FL2VA/`` or the ``FL2VA`` folder itself)::

    FL2VA/transformer/      config + model-*.safetensors        -> telefuser.models.minimax_h3 (DiT)
    FL2VA/text_encoder/     full Qwen3-VL (config.json, shards)  -> first 50 language layers
    FL2VA/processor/        Qwen3-VL processor / tokenizer files
    FL2VA/video_vae/source/ model.safetensors                    -> refused (no faithful decoder in this build)
    FL2VA/audio_vae/        config.json + model.safetensors      -> faithful BigVGAN decoder

The DiT modules are imported inside the functions: this package must import (and its tests run) without them.
The video-VAE refusal is checked before any weight is read, so a doomed run fails in a second, not after
loading 120 GB.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .pipeline import DEFAULT_TIMESTEP_SCALE, MiniMaxH3Pipeline
from .text_encoder import (
    SELECTED_LAYER,
    MiniMaxH3TextEncoder,
    PromptEncoder,
    official_text_config,
    tiny_text_config,
)
from .tokenizer import load_tokenizer
from .vae import load_audio_decoder, load_video_decoder

RANDOM = "random (no checkpoint)"
OFFLOADED = ", kept in host memory between prompts"
TINY_TEXT_LAYERS = 2


def resolve_partition(checkpoint: str | Path, partition: str = "FL2VA") -> Path:
    """The folder that holds ``transformer/``: ``<root>/<partition>`` or `checkpoint` itself."""
    root = Path(checkpoint)
    for candidate in (root / partition, root):
        if (candidate / "transformer").is_dir():
            return candidate
    raise FileNotFoundError(f"{root} is not a MiniMax H3 checkpoint: no {partition}/transformer or transformer folder")


def build_minimax_h3_pipeline(
    *,
    config: str = "tiny",
    checkpoint: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    mesh=None,
    seed: int = 0,
    attn_impl: str = "sdpa",
    allow_standin_video_vae: bool = False,
    timestep_scale: float = DEFAULT_TIMESTEP_SCALE,
    show_progress: bool = True,
    offload_text_encoder: bool = False,
) -> MiniMaxH3Pipeline:
    """`config` picks the random-weight sizes ("tiny" or "official") when `checkpoint` is None.
    `offload_text_encoder` keeps the text encoder in host memory except while it encodes (see `PromptEncoder`)."""
    device = torch.device(device)
    if checkpoint is not None:
        return _from_checkpoint(
            Path(checkpoint), device=device, dtype=dtype, mesh=mesh, attn_impl=attn_impl,
            allow_standin_video_vae=allow_standin_video_vae, timestep_scale=timestep_scale,
            show_progress=show_progress, offload_text_encoder=offload_text_encoder,
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
    dit = build_random_minimax_h3_dit(dit_config, seed, device, dtype, attn_impl=attn_impl,
                                      init_on_device=torch.device(device).type == "cuda")
    if mesh is not None and getattr(mesh, "world_size", 1) > 1:
        dit.enable_parallel(mesh)
    return MiniMaxH3Pipeline(
        dit,
        PromptEncoder(load_tokenizer(None), encoder, offload=offload_text_encoder),
        load_video_decoder(None),
        load_audio_decoder(None, device=device),
        device=device,
        patch_size=tuple(dit_config.patch_size),
        timestep_scale=timestep_scale,
        weights={
            "summary": f"{RANDOM}, {config} sizes",
            "dit": getattr(dit, "weights_source", RANDOM),
            "text_encoder": RANDOM + (OFFLOADED if offload_text_encoder else ""),
            "tokenizer": load_tokenizer(None).description,
            "video_vae": load_video_decoder(None).description,
            "audio_vae": "stand-in audio decoder (no checkpoint)",
        },
        show_progress=show_progress,
    )


def _from_checkpoint(
    checkpoint: Path, *, device, dtype, mesh, attn_impl, allow_standin_video_vae, timestep_scale, show_progress,
    offload_text_encoder: bool,
) -> MiniMaxH3Pipeline:
    part = resolve_partition(checkpoint)
    video_decoder = load_video_decoder(part / "video_vae", allow_standin=allow_standin_video_vae)  # refuses first
    from telefuser.models.minimax_h3.checkpoint import load_minimax_h3_dit

    audio_decoder = load_audio_decoder(part / "audio_vae", device=device)
    processor = part / "processor"
    tokenizer = load_tokenizer(processor if processor.is_dir() else None)
    encoder_device = "cpu" if offload_text_encoder else device  # offloaded: read straight into host memory
    encoder = MiniMaxH3TextEncoder.from_checkpoint(part / "text_encoder", device=encoder_device, dtype=dtype)
    dit = load_minimax_h3_dit(part / "transformer", device=device, dtype=dtype, mesh=mesh, attn_impl=attn_impl)
    config = getattr(dit, "config", None)
    patch_size = tuple(getattr(config, "patch_size", (1, 2, 2)))
    return MiniMaxH3Pipeline(
        dit,
        PromptEncoder(tokenizer, encoder, offload=offload_text_encoder),
        video_decoder,
        audio_decoder,
        device=device,
        patch_size=patch_size,
        timestep_scale=timestep_scale,
        weights={
            "summary": str(part),
            "dit": str(part / "transformer"),
            "text_encoder": f"{part / 'text_encoder'} (first {SELECTED_LAYER} language layers)"
                            + (OFFLOADED if offload_text_encoder else ""),
            "tokenizer": tokenizer.description,
            "video_vae": video_decoder.description,
            "audio_vae": audio_decoder.description,
        },
        show_progress=show_progress,
    )

