"""MiniMax H3's memory workload: one text-to-video+audio request on one rank, as `memory.plan` weighs it.

Weights are counted from the modules themselves, built on the meta device (no memory): the DiT at its TP slices and
in FP8 where `--quantization fp8` puts it, the text encoder, both VAEs. The per-request terms are formulas over the
request's shape; their calibration against measured peaks is in docs/perf (the estimate-vs-measured table).

Stacks: ``dit`` (its blocks without their AdaLN projections, which stream in the block tier), ``adaln`` (the AdaLN
projections: used once per request to make its tables), ``text_encoder`` (Qwen3-VL's first 50 language layers; its
token embedding is looked up on the host once offloaded), ``vae`` (both VAEs: lent to the device whole for the decode
once offloaded).
Stages: ``text`` (encode the prompt), ``tables`` (the AdaLN tables), ``denoise`` (the DiT calls), ``decode``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch

from ...memory.plan import Stack, Stage, Workload, text_encoder_stack
from ...ops.fp8 import is_block_linear
from .shapes import plan_shape

# Per token of the joint sequence on a rank: (ACTIVATION_HIDDEN x hidden + ACTIVATION_FFN x ffn / TP) elements in the
# compute dtype: 5.7 GiB for the official call (37,966 tokens), whose compiled blocks peaked 4.9 GiB above the weights
# and tables on the H100 (docs/perf/2026-12-06).
ACTIVATION_HIDDEN, ACTIVATION_FFN = 7, 3
TEXT_TOKENS = 1024  # a generous prompt; the joint sequence holds the text tokens too
IMAGE_REFERENCE_SHORT_EDGE, VAE_STRIDE = 2048, 16  # conditions.ReferencePolicy.image_short_edge; the video VAE's
LATENT_COPIES = 6  # video and audio latents in fp32 alive at once (state, noise, velocity, x0...)
# The decode: the clip as float32 (two copies) and uint8, plus DECODE_FEATURE_MAPS full-resolution float32 maps of
# DECODE_CHANNELS; 3.7 GiB at 1344x768 x 124 frames, where the decode peaked 3.0 GiB above the lent VAE (2026-12-06).
DECODE_FEATURE_MAPS, DECODE_CHANNELS = 1, 128


def workload(
    args,
    parallel,
    dtype: torch.dtype,
    request: Mapping,
) -> Workload:
    """The request `request` ({duration, resolution, aspect_ratio, steps}) with the MiniMax H3 flags in `args`, on one
    rank of `parallel` (a `ParallelConfig`), weights in `dtype`."""
    from ...models.minimax_h3.spec import MINIMAX_H3

    size = _size(args)
    quantization = MINIMAX_H3.option(args, "quantization")
    tp, ulysses = parallel.tp_degree, parallel.ulysses_degree
    element = torch.empty((), dtype=dtype).element_size()
    dit = _dit_bytes(size, element, quantization, tp)
    text = _text_encoder_bytes(size, element)
    vae = _vae_bytes(size, element)
    config = _dit_config(size)

    shape = plan_shape(
        duration_s=float(request["duration"]),
        resolution=request["resolution"],
        aspect_ratio=request.get("aspect_ratio", "16:9"),
        patch_size=tuple(config.patch_size),
    )
    dit_calls = max(1, int(request["steps"]) - 1)
    pt, ph, pw = config.patch_size
    video_tokens = (shape.video_latent_t // pt) * (shape.latent_h // ph) * (shape.latent_w // pw)
    # keyframes and references add condition rows to the joint sequence (`condition_rows`)
    conditions = condition_rows(shape, config, int(request.get("keyframes", 0)), request.get("references", ()))
    tokens = video_tokens + shape.audio_tokens + TEXT_TOKENS + conditions
    local_tokens = -(-tokens // ulysses)
    activations = local_tokens * (
        ACTIVATION_HIDDEN * config.hidden_size + ACTIVATION_FFN * config.ffn_hidden_size // tp
    )
    latents = 4 * (math.prod(shape.video_latent_shape) + math.prod(shape.audio_latent_shape))
    tables = dit_calls * 2 * (config.num_layers * config.adaln_out_features + config.final_adaln_out_features)
    pixels = shape.frame_count * shape.width * shape.height
    decode = pixels * 3 * (2 * 4 + 1) + DECODE_FEATURE_MAPS * shape.width * shape.height * DECODE_CHANNELS * 4
    text_hidden, text_ffn = _text_widths(size)
    prompt = TEXT_TOKENS * (4 * text_hidden + 3 * text_ffn) * element

    title = (
        f"MiniMax H3 {shape.width}x{shape.height} {shape.frame_count} frames, {dit_calls} DiT calls"
        f" ({size}, {dtype_name(dtype)}{', fp8 GEMMs' if quantization == 'fp8' else ''}, tp {tp} x ulysses {ulysses})"
    )
    return Workload(
        title=title,
        stacks=(
            Stack("dit", fixed=dit["fixed"], layer=dit["block"], count=config.num_layers),
            Stack(
                "adaln",
                fixed=dit["final_adaln"],
                layer=dit["block_adaln"],
                count=config.num_layers,
                per_request=True,
                fixed_offloads=True,
            ),
            text_encoder_stack(text["fixed"], text["layer"], text["count"]),
            Stack("vae", fixed=vae, per_request=True, fixed_offloads=True),
        ),
        held={"latents": LATENT_COPIES * latents},
        stages=(
            Stage("text", uses=("text_encoder",), transient={"prompt activations": prompt}),
            Stage("tables", uses=("adaln",), transient={"adaln tables": tables * element}),
            Stage(
                "denoise",
                uses=("dit",),
                transient={"activations": activations * element, "adaln tables": tables * element},
            ),
            Stage("decode", uses=("vae",), transient={"decode": decode}),
        ),
    )


def condition_rows(shape, config, keyframes: int, references) -> int:
    """Rows the conditions add to the joint sequence (conditions.py packs them): a latent frame of the clip's grid
    per keyframe; per image reference its own canvas at the 2048-pixel short edge (`references` holds each image's
    (width, height); a 16:9 image when unknown); a video reference at most the clip's video rows, an audio reference
    the clip's audio rows. An upper bound for videos (their canvas can be smaller)."""
    pt, ph, pw = config.patch_size
    frame = (shape.latent_h // ph) * (shape.latent_w // pw)
    rows = keyframes * frame
    for reference in references:
        kind, size = (reference, None) if isinstance(reference, str) else reference
        if kind == "image":
            width, height = size or (16, 9)
            short = min(width, height)
            side = [round(v * IMAGE_REFERENCE_SHORT_EDGE / short / 32) * 32 for v in (width, height)]
            rows += (side[0] // VAE_STRIDE // pw) * (side[1] // VAE_STRIDE // ph)
        elif kind == "video":
            rows += (shape.video_latent_t // pt) * frame
        else:
            rows += shape.audio_tokens
    return rows


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.lru_cache(maxsize=16)
def _dit_config(size: str):
    """The DiT config of a size name ("tiny" | "official") or of the checkpoint at that path."""
    from ...models.minimax_h3.config import MiniMaxH3Config

    if size in ("tiny", "official"):
        return MiniMaxH3Config.tiny() if size == "tiny" else MiniMaxH3Config()
    from ...models.minimax_h3.checkpoint import read_transformer_config
    from .loading import resolve_partition

    return read_transformer_config(resolve_partition(size) / "transformer")


@functools.lru_cache(maxsize=16)
def _dit_bytes(size: str, element: int, quantization: str, tp: int) -> dict[str, int]:
    """Bytes on one rank: the non-block tensors (`fixed`, less the final AdaLN projection), one block without its
    AdaLN projection (`block`), one block's AdaLN projection (`block_adaln`), the final one (`final_adaln`)."""
    from ...models.minimax_h3.dit import FP32_BUFFER_NAMES, FP32_PARAMETER_NAMES, MiniMaxH3DiT
    from ...models.minimax_h3.tp import style_for

    with torch.device("meta"):
        model = MiniMaxH3DiT(_dit_config(size))
    out = {"fixed": 0, "block": 0, "block_adaln": 0, "final_adaln": 0}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        module, _, leaf = name.rpartition(".")
        split = tp if tp > 1 and style_for(module) is not None else 1
        numel = tensor.numel() // split
        fp8 = quantization == "fp8" and is_block_linear(module, MiniMaxH3DiT.FP8_LINEARS)
        if name in FP32_PARAMETER_NAMES or name in FP32_BUFFER_NAMES:
            size_bytes = 4 * numel
        elif fp8 and leaf == "weight":
            size_bytes = numel + 4 * tensor.shape[0] // split  # e4m3 values and an fp32 scale per output row
        else:
            size_bytes = element * numel
        if name.startswith("blocks.0.adaln_proj."):
            out["block_adaln"] += size_bytes
        elif name.startswith("blocks.0."):
            out["block"] += size_bytes
        elif name.startswith("final_layer.adaln_proj."):
            out["final_adaln"] += size_bytes
        elif not name.startswith("blocks."):
            out["fixed"] += size_bytes
    return out


@functools.lru_cache(maxsize=16)
def _text_config(size: str):
    """(language config, layers run) of a size name or a checkpoint's ``text_encoder/``."""
    from .loading import TINY_TEXT_LAYERS, resolve_partition
    from .text_encoder import SELECTED_LAYER, official_text_config, tiny_text_config

    if size == "tiny":
        return tiny_text_config(hidden_size=int(_dit_config("tiny").text_dim)), TINY_TEXT_LAYERS
    if size == "official":
        return official_text_config(), SELECTED_LAYER
    from transformers import Qwen3VLConfig

    folder = resolve_partition(size) / "text_encoder"
    config = Qwen3VLConfig.from_pretrained(str(folder), local_files_only=True).text_config
    return config, min(SELECTED_LAYER, int(config.num_hidden_layers))


def _text_widths(size: str) -> tuple[int, int]:
    config, _ = _text_config(size)
    return int(config.hidden_size), int(config.intermediate_size)


@functools.lru_cache(maxsize=16)
def _text_encoder_bytes(size: str, element: int) -> dict[str, int]:
    """The encoder's non-layer tensors (`fixed`: the token embedding), one layer, and how many layers run."""
    from accelerate import init_empty_weights

    from .text_encoder import MiniMaxH3TextEncoder

    config, layers = _text_config(size)
    with init_empty_weights():
        encoder = MiniMaxH3TextEncoder(config, layers)
    layer = sum(p.numel() for p in encoder.model.layers[0].parameters()) * element
    total = sum(p.numel() for p in encoder.parameters()) * element
    total += sum(b.numel() * b.element_size() for b in encoder.buffers())  # the rotary tables (float32)
    return {"fixed": total - layers * layer, "layer": layer, "count": layers}


@functools.lru_cache(maxsize=16)
def _vae_bytes(size: str, element: int) -> int:
    """Both VAEs: the video VAE in the compute dtype (its pinned float32 modules in float32), the audio VAE in
    float32. A checkpoint's: its VAE files' sizes at 4 bytes a value (an upper bound; the VAEs are small)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    if size not in ("tiny", "official"):
        from .loading import resolve_partition

        part = resolve_partition(size)
        folders = [part / n for n in ("video_vae", "vae", "audio_vae") if (part / n).is_dir()]
        return sum(f.stat().st_size for folder in folders for f in folder.rglob("*.safetensors"))

    from .vae import OFFICIAL_VIDEO_VAE, TINY_AUDIO_VAE, TINY_VIDEO_VAE
    from .vae_checkpoint import build_empty, keeps_fp32

    video = build_empty(AutoencoderKLMiniMaxH3, dict(TINY_VIDEO_VAE if size == "tiny" else OFFICIAL_VIDEO_VAE))
    pinned = getattr(video, "_keep_in_fp32_modules", None)
    total = sum(p.numel() * (4 if keeps_fp32(n, pinned) else element) for n, p in video.named_parameters())
    audio = build_empty(AutoencoderKLMiniMaxH3Audio, dict(TINY_AUDIO_VAE) if size == "tiny" else {})
    buffers = [*video.buffers(), *audio.buffers()]  # computed tables, in the dtype they were made in
    return total + 4 * sum(p.numel() for p in audio.parameters()) + sum(b.numel() * b.element_size() for b in buffers)


def alternatives(args, parallel, dtype: torch.dtype, request: Mapping) -> list[tuple[str, Workload]]:
    """What a refusal may suggest: FP8 GEMMs, twice the TP degree (it splits the DiT's weights; Ulysses splits only
    activations), a 544-pixel short edge, half the duration."""
    import argparse

    from ...distributed.mesh import ParallelConfig

    out = []
    if getattr(args, "quantization", "none") != "fp8":
        fp8 = argparse.Namespace(**{**vars(args), "quantization": "fp8"})
        out.append(("--quantization fp8", workload(fp8, parallel, dtype, request)))
    config = _dit_config(_size(args))
    tp = parallel.tp_degree * 2
    if config.num_attention_heads % (tp * parallel.ulysses_degree) == 0:
        wider = ParallelConfig(ulysses_degree=parallel.ulysses_degree, tp_degree=tp)
        out.append((f"--tp-degree {tp} ({tp * parallel.ulysses_degree} GPUs)", workload(args, wider, dtype, request)))
    if str(request.get("resolution")) != "544":
        out.append(("--resolution 544", workload(args, parallel, dtype, {**request, "resolution": "544"})))
    half = float(request["duration"]) / 2
    out.append((f"--duration {half:g}", workload(args, parallel, dtype, {**request, "duration": half})))
    return out


def _size(args) -> str:
    from ...models.minimax_h3.spec import MINIMAX_H3

    checkpoint = MINIMAX_H3.option(args, "checkpoint")
    return str(checkpoint) if checkpoint is not None else MINIMAX_H3.option(args, "config")
