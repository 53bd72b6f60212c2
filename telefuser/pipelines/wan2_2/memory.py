"""Wan 2.2's memory workload: one text-to-video request on one rank, as `memory.plan` weighs it.

Weights are counted from the modules themselves, built on the meta device: each expert (its blocks' GEMMs in FP8
where `--quantization fp8` puts them; time embedding, modulation and head in float32), umT5, the VAE (float32, as
`build_wan22_pipeline` loads it). The per-request terms are formulas over the request's shape, calibrated against
measured peaks (the numbers are in docs/perf/2026-12-06 and the README's "Memory" section).

Stacks: ``high_noise`` and ``low_noise`` (T2V-A14B's experts; they run one after the other, so in the model tier
each lives in pinned host memory and is lent to the device whole while its steps run; in the block tier their blocks
stream) or ``dit`` (TI2V-5B's one DiT, resident until the block tier streams its blocks), ``text_encoder`` (umT5:
once per request; its token embedding is looked up on the host once offloaded), ``vae`` (resident). Stages:
``text``, ``denoise`` (one per expert), ``decode``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch

from ... import sizes
from ...memory.plan import Stack, Stage, Workload, text_encoder_stack
from ...ops.fp8 import is_block_linear

# One DiT call, per row (batch x tokens on a rank), in dim-wide elements of the compute dtype. Calibrated with the
# prompt K/V (`text_kv`, counted apart) to the A14B expert's peaks above its weights at 480p and 720p (81 frames, CFG
# batch 2, bf16, H100): the two points fit a line in rows whose intercept is that K/V (docs/perf/2026-12-06, call 6).
ACTIVATION_ROW_FACTOR = 8
# The VAE decode, per latent frame: DECODE_MAPS[vae] maps of the decoder's last-stage width at its last-stage
# resolution, four frames each, in the VAE's dtype, beside the clip in float32 (two copies) and uint8. Calibrated to
# the reserved peaks of the decodes that made a request's peak (H100): TI2V-5B's Wan 2.2 VAE at 1280x704x121
# (48.7 to 50.1 GiB reserved over three runs, docs/perf/2026-12-06 and 2026-12-07), T2V-A14B's Wan 2.1 VAE at
# 832x480x81 within 24 GiB (22.2 GiB reserved, the estimate 3% under, 2026-12-07).
DECODE_MAPS = {"wan2.1": 21, "wan2.2": 28}
LATENT_COPIES = 6  # fp32 latents alive at once: state, noise, the CFG pair, the flow, the scheduler's history
TEXT_TOKENS = 512  # umT5's text_len: every prompt is padded to it


def t2v_a14b_workload(args, parallel, dtype: torch.dtype, request: Mapping) -> Workload:
    return workload("t2v-a14b", args, parallel, dtype, request)


def ti2v_5b_workload(args, parallel, dtype: torch.dtype, request: Mapping) -> Workload:
    return workload("ti2v-5b", args, parallel, dtype, request)


def workload(variant: str, args, parallel, dtype: torch.dtype, request: Mapping) -> Workload:
    """`request` ({size: "WxH", num_frames}) of `variant` with its flags in `args`, on one rank of `parallel`, the
    experts and umT5 in `dtype`."""
    size = _size(args)
    quantization = getattr(args, "quantization", None) or "none"
    release = _release(variant, size)
    config = release.dit
    ulysses = parallel.ulysses_degree
    element = torch.empty((), dtype=dtype).element_size()
    width, height = parse_size(request["size"])
    frames = int(request["num_frames"])
    scale = release.vae_scale
    latent = (LATENT_CHANNELS[release.vae], (frames - 1) // 4 + 1, height // scale, width // scale)
    pt, ph, pw = config.patch_size
    tokens = (latent[1] // pt) * (latent[2] // ph) * (latent[3] // pw)
    rows = 2 * -(-tokens // ulysses)  # CFG: the guided pair in one call
    activations = rows * ACTIVATION_ROW_FACTOR * config.dim * element
    prompt_kv = 2 * config.num_layers * 2 * config.text_len * config.dim * element  # K and V of the pair, per block
    denoise = {"activations": activations, "prompt K/V": prompt_kv}

    expert_fixed, block, blocks = _dit_bytes(size, variant, element, quantization)
    text = _text_encoder_bytes(size, int(config.text_dim), element)
    vae_dtype = getattr(args, "vae_dtype", None) or "float32"
    vae_element = torch.empty((), dtype=getattr(torch, vae_dtype)).element_size()
    vae_bytes, decoder_width, decoder_stride = _vae_terms(release.vae, size, vae_element)
    maps = DECODE_MAPS[release.vae] * (width // decoder_stride) * (height // decoder_stride) * decoder_width * 4
    maps *= vae_element
    if release.vae == "wan2.1":
        maps = -(-maps // ulysses)  # its decode is split in bands of rows over the Ulysses group
    decode = frames * width * height * 3 * (2 * 4 + 1) + maps

    if release.experts == 2:
        dits = tuple(
            Stack(
                name,
                fixed=expert_fixed,
                layer=block,
                count=blocks,
                per_request=True,
                fixed_offloads=True,
                whole_until_block=True,
            )
            for name in ("high_noise", "low_noise")
        )
        denoising = (
            Stage("denoise high noise", uses=("high_noise",), transient=denoise),
            Stage("denoise low noise", uses=("low_noise",), transient=denoise),
        )
    else:
        dits = (Stack("dit", fixed=expert_fixed, layer=block, count=blocks),)
        denoising = (Stage("denoise", uses=("dit",), transient=denoise),)
    fp8 = ", fp8 GEMMs" if quantization == "fp8" else ""
    vae = "" if vae_dtype == "float32" else f", {vae_dtype} VAE"
    title = (
        f"Wan 2.2 {variant.upper()} {width}x{height} {frames} frames"
        f" ({size}, {str(dtype).removeprefix('torch.')}{fp8}{vae}, ulysses {ulysses})"
    )
    return Workload(
        title=title,
        stacks=(*dits, text_encoder_stack(text["fixed"], text["layer"], text["count"]), Stack("vae", fixed=vae_bytes)),
        held={"latents": LATENT_COPIES * 4 * math.prod(latent)},
        stages=(
            Stage("text", uses=("text_encoder",), transient={"prompt activations": _prompt_bytes(text, element)}),
            *denoising,
            Stage("decode", uses=("vae",), transient={"decode": decode}),
        ),
    )


LATENT_CHANNELS = {"wan2.1": 16, "wan2.2": 48}  # pipelines.wan.vae.LATENT_CHANNELS_OF


def parse_size(size: str) -> tuple[int, int]:
    return sizes.parse_size(size, what="a Wan 2.2 size", example="1280x720")


def request_from_args(variant: str, args) -> dict:
    """The request an entry point's flags describe (run_t2v.py's --size and --num-frames; `telefuser plan`'s
    --resolution WxH), the release's canvas and frames for those it lacks: what the memory plan is made for."""
    release = _release(variant, _size(args))
    size = getattr(args, "size", None) or getattr(args, "resolution", None) or "{}x{}".format(*release.size)
    return {"size": size, "num_frames": getattr(args, "num_frames", None) or release.frames}


def t2v_a14b_request(args) -> dict:
    return request_from_args("t2v-a14b", args)


def ti2v_5b_request(args) -> dict:
    return request_from_args("ti2v-5b", args)


def alternatives(variant: str, args, parallel, dtype: torch.dtype, request: Mapping) -> list[tuple[str, Workload]]:
    """What a refusal may suggest: FP8 GEMMs (half the experts' bytes), a bfloat16 VAE (half the decode's maps), twice
    the Ulysses degree (it splits the activations, not the weights), the 832x480 canvas, half the frames."""
    import argparse

    from ...distributed.mesh import ParallelConfig

    out = []
    if getattr(args, "quantization", "none") != "fp8":
        fp8 = argparse.Namespace(**{**vars(args), "quantization": "fp8"})
        out.append(("--quantization fp8", workload(variant, fp8, parallel, dtype, request)))
    if (getattr(args, "vae_dtype", None) or "float32") == "float32":
        half = argparse.Namespace(**{**vars(args), "vae_dtype": "bfloat16"})
        out.append(("--vae-dtype bfloat16", workload(variant, half, parallel, dtype, request)))
    heads = _release(variant, _size(args)).dit.num_heads
    ulysses = parallel.ulysses_degree * 2
    if heads % ulysses == 0:
        wider = ParallelConfig(ulysses_degree=ulysses, tp_degree=1)
        out.append((f"--ulysses-degree {ulysses} ({ulysses} GPUs)", workload(variant, args, wider, dtype, request)))
    width, height = parse_size(request["size"])
    if width * height > 832 * 480:
        out.append(("--size 832x480", workload(variant, args, parallel, dtype, {**request, "size": "832x480"})))
    frames = int(request["num_frames"])
    if frames > 5:
        half = (frames - 1) // 8 * 4 + 1  # 4n + 1
        out.append((f"--num-frames {half}", workload(variant, args, parallel, dtype, {**request, "num_frames": half})))
    return out


def t2v_a14b_alternatives(args, parallel, dtype, request) -> list[tuple[str, Workload]]:
    return alternatives("t2v-a14b", args, parallel, dtype, request)


def ti2v_5b_alternatives(args, parallel, dtype, request) -> list[tuple[str, Workload]]:
    return alternatives("ti2v-5b", args, parallel, dtype, request)


def _size(args) -> str:
    """ "official" with a checkpoint (the release's sizes, as `build_wan22_pipeline` loads it), else --config."""
    return "official" if getattr(args, "checkpoint", None) is not None else getattr(args, "config", None) or "tiny"


def _release(variant: str, size: str):
    from ...models.wan2_2.config import release

    return release(variant, size)


@functools.lru_cache(maxsize=16)
def _dit_bytes(size: str, variant: str, element: int, quantization: str) -> tuple[int, int, int]:
    """One expert's bytes in the dtypes it runs in (dense: Ulysses does not split weights): (outside the blocks, one
    block, how many blocks)."""
    from ...models.wan.checkpoint import keeps_fp32
    from ...models.wan2_2.dit import Wan22DiT

    with torch.device("meta"):
        model = Wan22DiT(_release(variant, size).dit)
    fixed, blocks = 0, [0] * len(model.blocks)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        module, _, leaf = name.rpartition(".")
        if keeps_fp32(name):
            nbytes = 4 * tensor.numel()
        elif quantization == "fp8" and leaf == "weight" and is_block_linear(module, Wan22DiT.FP8_LINEARS):
            nbytes = tensor.numel() + 4 * tensor.shape[0]  # e4m3 values and an fp32 scale per output row
        else:
            nbytes = element * tensor.numel()
        if name.startswith("blocks."):
            blocks[int(name.split(".")[1])] += nbytes
        else:
            fixed += nbytes
    return fixed, max(blocks), len(blocks)


@functools.lru_cache(maxsize=16)
def _text_encoder_bytes(size: str, text_dim: int, element: int) -> dict[str, int]:
    """umT5's non-block tensors (`fixed`: the tied token embedding, the final norm), one block, how many blocks;
    `d_model` and `d_ff` for the prompt's activations."""
    from accelerate import init_empty_weights
    from transformers import UMT5Config, UMT5EncoderModel

    from ..wan.text_encoder import OFFICIAL_UMT5, tiny_umt5_config

    config = dict(OFFICIAL_UMT5) if size == "official" else tiny_umt5_config(text_dim)
    with init_empty_weights():
        model = UMT5EncoderModel(UMT5Config(**config))
    model.tie_weights()  # the token embedding is one tensor, counted once
    layer = sum(p.numel() for p in model.encoder.block[0].parameters()) * element
    total = sum(p.numel() for p in model.parameters()) * element
    count = len(model.encoder.block)
    return {"fixed": total - count * layer, "layer": layer, "count": count, "d_model": config["d_model"],
            "d_ff": config["d_ff"]}  # fmt: skip


def _prompt_bytes(text: Mapping[str, int], element: int) -> int:
    return TEXT_TOKENS * (4 * text["d_model"] + 3 * text["d_ff"]) * element


@functools.lru_cache(maxsize=8)
def _vae_terms(kind: str, size: str, element: int) -> tuple[int, int, int]:
    """(the VAE's bytes with its floating tensors at `element` bytes, its decoder's last-stage width, that stage's
    stride in pixels)."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLWan

    from ..wan.vae import VAE_CONFIGS

    config = VAE_CONFIGS[kind, size]
    with init_empty_weights():
        model = AutoencoderKLWan(**config)
    tensors = [*model.parameters(), *model.buffers()]
    weights = sum(t.numel() * (element if t.is_floating_point() else t.element_size()) for t in tensors)
    width = int(config.get("decoder_base_dim") or config["base_dim"])
    return weights, width, int(config.get("patch_size") or 1)
