"""Wan 2.2's pipeline from its flags: the memory workload of one request (what `memory.plan` places), and the
`Wan22Pipeline` assembled under that placement from a release folder (original or diffusers layout) or random weights.

Every path is checked before any weight is read. The text encoder and VAE come from `pipelines.wan.components`,
the experts from `models.wan2_2.checkpoint`; each expert is parallelized by `runtime` with its variant's spec.

The workload is one text-to-video request on one rank. Its weights are the Wan family's terms (`pipelines.wan.memory`):
each expert (its blocks' GEMMs in FP8 where `--quantization fp8` puts them; time embedding, modulation and head in
float32), umT5, the VAE (float32 unless `--vae-dtype`, as `build_wan22_pipeline` loads it). The per-request terms are
formulas over the request's shape, calibrated against measured peaks (the numbers are in docs/perf/2026-12-06 and the
README's "Memory" section). Stacks: ``high_noise`` and ``low_noise`` (T2V-A14B's experts; they run one after the
other, so in the model tier each lives in pinned host memory and is lent to the device whole while its steps run; in
the block tier their blocks stream) or ``dit`` (TI2V-5B's one DiT, resident until the block tier streams its blocks),
``text_encoder`` (umT5: once per request; its token embedding is looked up on the host once offloaded), ``vae``
(resident). Stages: ``text``, ``denoise`` (one per expert), ``decode``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from ... import sizes
from ...memory.host import HostResident
from ...memory.plan import Placement, Stack, Stage, Workload
from ...memory.streaming import block_finisher
from ...models.wan2_2 import checkpoint as dit_checkpoint
from ...models.wan2_2.config import Wan22Release, release
from ...models.wan2_2.dit import Wan22DiT
from ...models.wan2_2.spec import WAN22_T2V_A14B, WAN22_TI2V_5B
from ...ops.fp8 import QUANTIZATIONS
from ...dtypes import torch_dtype
from ...runtime import Runtime
from ..wan.components import component_paths, text_and_vae
from ..wan.memory import dit_bytes, prompt_activation_bytes, umt5_stack, vae_terms
from ..wan.text_encoder import UMT5PromptEncoder
from ..wan.vae import LATENT_CHANNELS_OF
from .pipeline import Wan22Pipeline

VAE_FILES = {"wan2.1": "Wan2.1_VAE.pth", "wan2.2": "Wan2.2_VAE.pth"}
SPECS = {"t2v-a14b": WAN22_T2V_A14B, "ti2v-5b": WAN22_TI2V_5B}  # variant -> its ModelSpec
EXPERT_STACKS = {2: ("high_noise", "low_noise"), 1: ("dit",)}  # the memory workload's stack of each expert
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


def resolve_checkpoint(root: str | Path, variant: Wan22Release) -> dict:
    """{vae, text_encoder, tokenizer, experts: [dirs], boundary_ratio} of a release folder in either layout;
    FileNotFoundError naming every missing part."""
    root = Path(root).expanduser()
    paths = component_paths(root, VAE_FILES[variant.vae])
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{root} is not a Wan 2.2 {variant.name} folder; missing: {', '.join(missing)}")
    paths["experts"] = dit_checkpoint.expert_dirs(root, variant.experts)
    paths["boundary_ratio"] = dit_checkpoint.boundary_ratio(root)
    return paths


def build_wan22_pipeline(
    *,
    variant: str = "t2v-a14b",
    config: str = "tiny",
    checkpoint: str | Path | None = None,
    runtime: Runtime | None = None,
    seed: int = 0,
    attn_impl: str = "sdpa",
    quantization: str = "none",
    vae_dtype: torch.dtype = torch.float32,
    placement: Placement | None = None,
) -> Wan22Pipeline:
    """`variant` ("t2v-a14b" | "ti2v-5b") at `config` ("tiny" | "official") sizes without `checkpoint`. `runtime`
    (None: one rank, `Runtime.one_rank("cpu", torch.bfloat16)`) gives the device, the dtype and the layout every
    expert is parallelized over (`Runtime.parallelize` with the variant's spec). `quantization` "fp8" runs the
    blocks' projection and FFN GEMMs in FP8 (each block quantized as it loads). `placement` (a
    `memory.plan.Placement`; None: everything on the device): an offloaded expert goes to pinned host memory: in the
    model tier (T2V-A14B) whole once loaded, lent to the device while its steps run (`HostResident`); in the block
    tier all but the plan's resident blocks as they load, each streamed to the device while it computes
    (`Wan22DiT.stream_blocks`). An offloaded umT5 streams its blocks while it encodes (`UMT5PromptEncoder`)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if runtime is None:
        runtime = Runtime.one_rank("cpu", torch.bfloat16)
    device, dtype = runtime.device, runtime.dtype
    size = "official" if checkpoint is not None else config
    variant_info = release(variant, size)
    paths = resolve_checkpoint(checkpoint, variant_info) if checkpoint is not None else None
    stacks = EXPERT_STACKS[variant_info.experts]
    text_from = placement.resident_layers("text_encoder") if placement is not None else None
    vae, tokenizer, encoder, weights = text_and_vae(
        size,
        checkpoint,
        paths,
        device=device,
        dtype=dtype,
        vae_dtype=vae_dtype,
        seed=seed,
        text_from=text_from,
        tiny_text_dim=variant_info.dit.text_dim,
        vae_kind=variant_info.vae,
    )
    experts, homes = [], []
    for index in range(variant_info.experts):
        streamed = placement is not None and placement.tier == "block" and placement.streams(stacks[index])
        resident = placement.resident[stacks[index]] if streamed else None
        finish = block_finisher(quantization, resident)
        if paths is None:  # the experts differ: one seed each
            dit = dit_checkpoint.build_random_wan22_dit(
                variant_info.dit,
                seed + index,
                device,
                dtype,
                attn_impl=attn_impl,
                init_on_device=device.type == "cuda",
                after_block=finish,
            )
        else:
            dit = dit_checkpoint.load_wan22_dit(
                paths["experts"][index], device=device, dtype=dtype, attn_impl=attn_impl, after_block=finish
            )
        if quantization != "none":
            dit.weights_source += ", fp8 GEMMs"
        # one Ulysses communicator for both experts: they run one after the other, so one set of peer buffers serves
        shared = (lambda group: experts[0].communicator) if experts else None
        experts.append(runtime.parallelize(dit, SPECS[variant], communicator_factory=shared))
        if streamed:
            dit.stream_blocks(device, resident=resident)
        # to host memory before the next expert loads: the device never holds both
        lent = placement is not None and placement.tier == "model" and placement.streams(stacks[index])
        homes.append(HostResident(dit) if lent else None)
    weights["dit"] = ", ".join(str(d) for d in paths["experts"]) if paths else weights["dit"]
    if any(homes):
        weights["dit"] += "; experts in pinned host memory, each lent to the device while its steps run"
    elif any(e.block_stream is not None for e in experts):
        weights["dit"] += "; blocks streamed from pinned host memory while they compute"
    if placement is not None:
        weights["placement"] = f"--offload {placement.tier}"
    if paths is not None and paths["boundary_ratio"] is not None:
        variant_info = replace(variant_info, boundary_ratio=paths["boundary_ratio"])
    if int(encoder.config.d_model) != variant_info.dit.text_dim:
        raise ValueError(f"text encoder width {encoder.config.d_model} != DiT text_dim {variant_info.dit.text_dim}")
    mesh = runtime.mesh
    vae_group = mesh.ulysses_group if mesh is not None and mesh.config.ulysses_degree > 1 else None
    return Wan22Pipeline(
        experts,
        UMT5PromptEncoder(
            tokenizer, encoder, text_len=variant_info.dit.text_len, streamed_from=text_from, device=device
        ),
        vae,
        variant_info,
        device=device,
        vae_group=vae_group,
        weights=weights,
        homes=homes,
    )


def pipeline_from_args(variant: str, args: argparse.Namespace, runtime, **overrides) -> Wan22Pipeline:
    """The pipeline the variant's flags in `args` describe, on `runtime`; --attn-impl resolved and agreed by all
    ranks, and the memory plan made (`ModelSpec.memory_plan`: it refuses before anything loads), unless `overrides`
    names them (`attn_impl`, `placement`)."""
    spec = SPECS[variant]
    options = spec.options(args, "config", "checkpoint", "quantization")
    options["vae_dtype"] = torch_dtype(spec.option(args, "vae_dtype"))
    if "attn_impl" not in overrides:
        options["attn_impl"] = spec.attention_impl(args, runtime)
    if "placement" not in overrides:
        options["placement"] = spec.memory_plan(args, runtime, spec.request_from_args(args)).placement
    return build_wan22_pipeline(variant=variant, runtime=runtime, **{**options, **overrides})


# -- the memory workload ---------------------------------------------------------------------------------------------
def request_from_args(variant: str, args) -> dict:
    """The request an entry point's flags describe (run_t2v.py's --size and --num-frames; `telefuser plan`'s
    --resolution WxH), the release's canvas and frames for those it lacks: what the memory plan is made for."""
    variant_info = release(variant, _size(args))
    size = getattr(args, "size", None) or getattr(args, "resolution", None) or "{}x{}".format(*variant_info.size)
    return {"size": size, "num_frames": getattr(args, "num_frames", None) or variant_info.frames}


def workload(variant: str, args, parallel, dtype: torch.dtype, request: Mapping) -> Workload:
    """`request` ({size: "WxH", num_frames}) of `variant` with its flags in `args`, on one rank of `parallel`, the
    experts and umT5 in `dtype`."""
    size = _size(args)
    quantization = getattr(args, "quantization", None) or "none"
    variant_info = release(variant, size)
    config = variant_info.dit
    ulysses = parallel.ulysses_degree
    element = torch.empty((), dtype=dtype).element_size()
    width, height = parse_size(request["size"])
    frames = int(request["num_frames"])
    scale = variant_info.vae_scale
    latent = (LATENT_CHANNELS_OF[variant_info.vae], (frames - 1) // 4 + 1, height // scale, width // scale)
    pt, ph, pw = config.patch_size
    tokens = (latent[1] // pt) * (latent[2] // ph) * (latent[3] // pw)
    rows = 2 * -(-tokens // ulysses)  # CFG: the guided pair in one call
    activations = rows * ACTIVATION_ROW_FACTOR * config.dim * element
    prompt_kv = 2 * config.num_layers * 2 * config.text_len * config.dim * element  # K and V of the pair, per block
    denoise = {"activations": activations, "prompt K/V": prompt_kv}

    expert = dit_bytes(Wan22DiT, config, element, quantization)
    vae_dtype = getattr(args, "vae_dtype", None) or "float32"
    vae_element = torch.empty((), dtype=getattr(torch, vae_dtype)).element_size()
    vae = vae_terms(variant_info.vae, size, vae_element)
    stride = vae.decoder_stride
    maps = DECODE_MAPS[variant_info.vae] * (width // stride) * (height // stride) * vae.decoder_width * 4 * vae_element
    if variant_info.vae == "wan2.1":
        maps = -(-maps // ulysses)  # its decode is split in bands of rows over the Ulysses group
    decode = frames * width * height * 3 * (2 * 4 + 1) + maps

    stacks = EXPERT_STACKS[variant_info.experts]
    if variant_info.experts == 2:
        dits = tuple(
            Stack(
                name,
                fixed=expert.fixed,
                layer=expert.block,
                count=expert.count,
                per_request=True,
                fixed_offloads=True,
                whole_until_block=True,
            )
            for name in stacks
        )
        denoising = tuple(
            Stage(f"denoise {name.replace('_', ' ')}", uses=(name,), transient=denoise) for name in stacks
        )
    else:
        dits = (Stack(stacks[0], fixed=expert.fixed, layer=expert.block, count=expert.count),)
        denoising = (Stage("denoise", uses=stacks, transient=denoise),)
    fp8 = ", fp8 GEMMs" if quantization == "fp8" else ""
    vae_label = "" if vae_dtype == "float32" else f", {vae_dtype} VAE"
    title = (
        f"Wan 2.2 {variant.upper()} {width}x{height} {frames} frames"
        f" ({size}, {str(dtype).removeprefix('torch.')}{fp8}{vae_label}, ulysses {ulysses})"
    )
    text_dim = int(config.text_dim)
    return Workload(
        title=title,
        stacks=(*dits, umt5_stack(size, text_dim, element), Stack("vae", fixed=vae.weight_bytes)),
        held={"latents": LATENT_COPIES * 4 * math.prod(latent)},
        stages=(
            Stage(
                "text",
                uses=("text_encoder",),
                transient={"prompt activations": prompt_activation_bytes(size, text_dim, element)},
            ),
            *denoising,
            Stage("decode", uses=("vae",), transient={"decode": decode}),
        ),
    )


def alternatives(variant: str, args, parallel, dtype: torch.dtype, request: Mapping) -> list[tuple[str, Workload]]:
    """What a refusal may suggest: FP8 GEMMs (half the experts' bytes), a bfloat16 VAE (half the decode's maps), twice
    the Ulysses degree (it splits the activations, not the weights), the 832x480 canvas, half the frames."""
    from ...distributed.mesh import ParallelConfig

    out = []
    if getattr(args, "quantization", "none") != "fp8":
        fp8 = argparse.Namespace(**{**vars(args), "quantization": "fp8"})
        out.append(("--quantization fp8", workload(variant, fp8, parallel, dtype, request)))
    if (getattr(args, "vae_dtype", None) or "float32") == "float32":
        half = argparse.Namespace(**{**vars(args), "vae_dtype": "bfloat16"})
        out.append(("--vae-dtype bfloat16", workload(variant, half, parallel, dtype, request)))
    heads = release(variant, _size(args)).dit.num_heads
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


def parse_size(size: str) -> tuple[int, int]:
    return sizes.parse_size(size, what="a Wan 2.2 size", example="1280x720")


def _size(args) -> str:
    """ "official" with a checkpoint (the release's sizes, as `build_wan22_pipeline` loads it), else --config."""
    return "official" if getattr(args, "checkpoint", None) is not None else getattr(args, "config", None) or "tiny"
