"""Assemble a `Wan22Pipeline` from a release folder (original or diffusers layout) or from random weights.

Every path is checked before any weight is read. The text encoder and VAE come from `pipelines.wan.components`,
the experts from `models.wan2_2.checkpoint`; each expert is parallelized by `runtime` with its variant's spec.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from ...memory.host import HostResident
from ...memory.plan import Placement
from ...memory.streaming import block_finisher
from ...models.wan2_2 import checkpoint as dit_checkpoint
from ...models.wan2_2.config import Wan22Release, release
from ...models.wan2_2.spec import WAN22_T2V_A14B, WAN22_TI2V_5B
from ...ops.fp8 import QUANTIZATIONS
from ...dtypes import torch_dtype
from ...runtime import Runtime
from ..wan.components import component_paths, text_and_vae
from ..wan.text_encoder import UMT5PromptEncoder
from .pipeline import Wan22Pipeline

VAE_FILES = {"wan2.1": "Wan2.1_VAE.pth", "wan2.2": "Wan2.2_VAE.pth"}
SPECS = {"t2v-a14b": WAN22_T2V_A14B, "ti2v-5b": WAN22_TI2V_5B}  # variant -> its ModelSpec
EXPERT_STACKS = {2: ("high_noise", "low_noise"), 1: ("dit",)}  # the memory workload's stack of each expert


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


def t2v_a14b_from_args(args: argparse.Namespace, runtime, **overrides) -> Wan22Pipeline:
    return pipeline_from_args("t2v-a14b", args, runtime, **overrides)


def ti2v_5b_from_args(args: argparse.Namespace, runtime, **overrides) -> Wan22Pipeline:
    return pipeline_from_args("ti2v-5b", args, runtime, **overrides)
