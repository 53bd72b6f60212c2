"""Assemble a `MiniMaxH3Pipeline` from a checkpoint folder (the release, its ``FL2VA/`` or ``Ref2VA/`` partition or a
diffusers directory) or from random weights.

The layouts are in this folder's README. The VAEs load first (seconds), so a folder with a broken VAE fails before
the 120 GB of DiT and text encoder; the DiT modules are imported inside the functions, so this package imports (and
its tests run) without them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ...memory.plan import Placement
from ...memory.streaming import streamed_layers
from ...models.minimax_h3.spec import MINIMAX_H3
from ...ops.fp8 import QUANTIZATIONS
from ...runtime import Runtime
from .pipeline import DEFAULT_TIMESTEP_SCALE, PARTITION_TASKS, MiniMaxH3Pipeline
from .scheduler import DEFAULT_NUM_STEPS
from .shapes import OFFICIAL_SHORT_EDGE
from .text_encoder import (
    SELECTED_LAYER,
    MiniMaxH3TextEncoder,
    Qwen3VLPromptEncoder,
    official_text_config,
    tiny_text_config,
)
from .tokenizer import load_tokenizer
from .vae import AudioDecoder, VideoDecoder, random_audio_vae, random_video_vae
from .vae_checkpoint import load_audio_vae, load_video_vae

RANDOM = "random (no checkpoint)"
TINY_TEXT_LAYERS = 2
DEFAULT_DURATION = 5.0  # seconds: the official request
PARTITIONS = tuple(PARTITION_TASKS)  # ("FL2VA", "Ref2VA")
# the diffusers component a LoRA for each partition targets (models.minimax_h3.lora.PARTITIONS, inverted)
LORA_PARTITIONS = {"FL2VA": "transformer", "Ref2VA": "transformer_ref"}
# Random weights: the Ref2VA DiT is another seeded draw than the FL2VA one (its text encoder and VAEs are the same).
REF2VA_RANDOM_SEED_OFFSET = 1


def resolve_partition(checkpoint: str | Path, partition: str = "FL2VA") -> Path:
    """The folder that holds ``transformer/``: ``<root>/<partition>`` or `checkpoint` itself. A partition folder
    named after the other partition (``.../FL2VA`` asked for "Ref2VA") is refused: its DiT is the wrong one."""
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    root = Path(checkpoint)
    if (root / partition / "transformer").is_dir():
        return root / partition
    others = {p.lower() for p in PARTITIONS if p != partition}
    if root.name.lower() in others and (root / "transformer").is_dir():
        raise FileNotFoundError(
            f"{root} is the {root.name} partition; a {partition} pipeline needs the {partition} DiT"
        )
    if (root / "transformer").is_dir():
        return root
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
    runtime: Runtime | None = None,
    seed: int = 0,
    attn_impl: str = "sdpa",
    timestep_scale: float = DEFAULT_TIMESTEP_SCALE,
    show_progress: bool = True,
    placement: Placement | None = None,
    qkv_layout: str | None = None,
    quantization: str = "none",
    partition: str = "FL2VA",
    loras: Sequence[tuple[str | Path, float]] = (),
    lora_switching: bool = False,
) -> MiniMaxH3Pipeline:
    """`config` picks the random-weight sizes ("tiny" or "official") when `checkpoint` is None.
    `partition` picks the DiT: "FL2VA" (T2VA and FL2VA requests: ``<root>/FL2VA``) or "Ref2VA" (Ref2VA requests:
    ``<root>/Ref2VA``; random weights: another seeded DiT, `REF2VA_RANDOM_SEED_OFFSET`); `pipeline.partition_for_task`
    maps a task to it.
    `runtime` (None: one rank, `Runtime.one_rank("cpu", torch.bfloat16)`) gives the device, the dtype and the layout
    the DiT is parallelized over (`Runtime.parallelize` with this model's spec: TP, then Ulysses).
    `placement` (a `memory.plan.Placement`; None: everything on the device) says which layers of the ``text_encoder``,
    ``adaln`` and ``dit`` stacks stay on the device; the others are put in pinned host memory as they load, one
    tensor or block at a time, and stream while they run (`Qwen3VLPromptEncoder`, `MiniMaxH3DiT.offload_adaln`,
    `MiniMaxH3DiT.stream_blocks`). `qkv_layout` is passed to the DiT loader (for re-exported single files).
    `quantization` "fp8" runs the joint blocks' GEMMs in FP8, each block quantized on the device as soon as it is
    loaded (after TP: each rank quantizes its slices).
    `loras`: ``(file, scale)`` pairs merged into the DiT once it is loaded (`models.minimax_h3.lora`; every file is
    read, and refused if it does not fit this partition's DiT, before any weight loads). `lora_switching` keeps what
    a later `lora.apply` needs to switch LoRA sets exactly (a service's per-job LoRAs): host copies of the touched
    weights and, under FP8, of every block's dense FP8 linears; not with streamed blocks."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    if runtime is None:
        runtime = Runtime.one_rank("cpu", torch.bfloat16)
    where = Where.of(placement)
    if lora_switching and where.dit is not None:
        raise ValueError("switching LoRAs needs the DiT's blocks resident: use --offload none or model, not block")
    from telefuser.models.minimax_h3 import lora

    lora_files = [(lora.read_lora(path, partition=LORA_PARTITIONS[partition]), float(s)) for path, s in loras]
    keep_dense = quantization == "fp8" and bool(lora_files or lora_switching)  # FP8 re-quantizes from these
    where = replace(where, keep_dense=keep_dense)
    pipe = _build(
        config=config,
        checkpoint=checkpoint,
        runtime=runtime,
        seed=seed,
        attn_impl=attn_impl,
        timestep_scale=timestep_scale,
        show_progress=show_progress,
        where=where,
        qkv_layout=qkv_layout,
        quantization=quantization,
        partition=partition,
    )
    dit = pipe.dit
    if quantization != "none":
        dit.weights_source = f"{dit.weights_source}, fp8 GEMMs"
    if lora_files:  # before any block streams: a merge writes the blocks where they live
        lora.merge(dit, lora_files, reversible=lora_switching)
        pipe.weights["loras"] = ", ".join(f"{file.name} x{scale:g}" for file, scale in lora_files)
    notes = []
    if where.adaln is not None:
        moved = dit.offload_adaln(resident=where.adaln)
        notes.append(
            f"AdaLN projections {where.adaln}/{len(dit.blocks)} resident ({moved / 2**30:.2f} GiB in host memory)"
        )
    if where.dit is not None:
        moved = dit.stream_blocks(runtime.device, resident=where.dit)
        notes.append(f"blocks {where.dit}/{len(dit.blocks)} resident, the rest streamed ({moved / 2**30:.2f} GiB)")
    if dit.adaln_offloaded:
        pipe.adaln_tables = True  # a DiT without its projections on the device needs them for every call
    if notes:
        pipe.weights["dit"] = f"{pipe.weights['dit']}; " + "; ".join(notes)
    if placement is not None:
        pipe.weights["placement"] = f"--offload {placement.tier}"
    return pipe


@dataclass(frozen=True)
class Where:
    """Resident layers of each streamable stack (None: all of it on the device), read off a `Placement`."""

    text_encoder: int | None = None
    adaln: int | None = None
    dit: int | None = None
    vae: bool = False  # the VAEs live in host memory, lent to the device for each decode
    keep_dense: bool = False  # keep each block's dense FP8 linears in host memory before quantizing (LoRA merges)

    @classmethod
    def of(cls, placement: Placement | None) -> Where:
        if placement is None:
            return cls()
        layers = (placement.resident_layers(name) for name in ("text_encoder", "adaln", "dit"))
        return cls(*layers, vae=placement.streams("vae"))

    def lend_vae_to(self, device):
        return device if self.vae else None

    def finish_block(self, quantization: str):
        """The loaders' `after_block(model, i)`: quantize block i, then move what streams to host memory."""

        def finish(model, index: int) -> None:
            streamed = () if self.dit is None else streamed_layers(len(model.blocks), self.dit)
            if self.keep_dense:
                from telefuser.models.minimax_h3.lora import keep_dense_weights

                keep_dense_weights(model, blocks=[index])
            model.finish_block(
                index,
                quantization=quantization,
                block_to_host=index in streamed,
                adaln_to_host=self.adaln is not None and index >= self.adaln,
            )

        return finish


def pipeline_from_args(args: argparse.Namespace, runtime: Runtime, **overrides) -> MiniMaxH3Pipeline:
    """The pipeline the MiniMax H3 flags in `args` describe (`MINIMAX_H3.flags`; a flag `args` lacks takes its
    default), on `runtime`'s device, dtype and layout; `overrides` are `build_minimax_h3_pipeline` keywords that
    replace or add to those. --attn-impl (auto included) is resolved and agreed by all ranks
    (`MINIMAX_H3.attention_impl`) unless `overrides` names the implementation."""
    options = MINIMAX_H3.options(args, "config", "checkpoint", "quantization", "qkv_layout")
    if "attn_impl" not in overrides:
        options["attn_impl"] = MINIMAX_H3.attention_impl(args, runtime)
    if "placement" not in overrides:
        options["placement"] = MINIMAX_H3.memory_plan(args, runtime, request_from_args(args)).placement
    return build_minimax_h3_pipeline(**{**options, "runtime": runtime, **overrides})


def request_from_args(args: argparse.Namespace) -> dict:
    """The request an entry point's flags describe (`run_t2va.py`'s --duration, --resolution, --aspect-ratio,
    --steps, its keyframes and loaded references), with the official request's values for those it lacks: what the
    memory plan is made for."""
    keyframes = sum(getattr(args, name, None) is not None for name in ("image", "last_image"))
    return {
        "duration": getattr(args, "duration", None) or DEFAULT_DURATION,
        "resolution": getattr(args, "resolution", None) or str(OFFICIAL_SHORT_EDGE),
        "aspect_ratio": getattr(args, "aspect_ratio", None) or "16:9",
        "steps": getattr(args, "steps", None) or DEFAULT_NUM_STEPS,
        "keyframes": keyframes,
        "references": [reference_size(ref) for ref in getattr(args, "references", None) or ()],
    }


def reference_size(reference) -> tuple[str, tuple[int, int] | None]:
    """(kind, (width, height) of an image reference), what the memory plan counts a reference by."""
    if reference.kind != "image":
        return reference.kind, None
    image = reference.image
    if hasattr(image, "size") and not callable(image.size):  # PIL: (width, height)
        return "image", tuple(image.size)
    shape = tuple(image.shape)
    return "image", (shape[1], shape[0]) if shape[-1] in (3, 4) else (shape[2], shape[1])


def _build(
    *,
    config,
    checkpoint,
    runtime: Runtime,
    seed,
    attn_impl,
    timestep_scale,
    show_progress,
    where: Where,
    qkv_layout,
    quantization: str,
    partition: str = "FL2VA",
) -> MiniMaxH3Pipeline:
    if checkpoint is not None:
        return _from_checkpoint(
            Path(checkpoint),
            runtime=runtime,
            attn_impl=attn_impl,
            timestep_scale=timestep_scale,
            show_progress=show_progress,
            where=where,
            qkv_layout=qkv_layout,
            quantization=quantization,
            partition=partition,
        )
    if config not in ("tiny", "official"):
        raise ValueError(f"config must be 'tiny' or 'official', got {config!r}")
    from telefuser.models.minimax_h3.checkpoint import build_random_minimax_h3_dit
    from telefuser.models.minimax_h3.config import MiniMaxH3Config

    device, dtype, mesh = runtime.device, runtime.dtype, runtime.mesh
    dit_config = MiniMaxH3Config.tiny() if config == "tiny" else MiniMaxH3Config()
    if config == "tiny":
        text_config, text_layers = tiny_text_config(hidden_size=int(dit_config.text_dim)), TINY_TEXT_LAYERS
    else:
        text_config, text_layers = official_text_config(), SELECTED_LAYER
    encoder = MiniMaxH3TextEncoder.random(
        text_config, num_layers=text_layers, seed=seed, device=device, dtype=dtype, host_from=where.text_encoder
    )
    # on a GPU, draw there: drawing the 33B-parameter official DiT on the host takes minutes
    on_device = device.type == "cuda"
    finish = where.finish_block(quantization)
    dense = mesh is None or mesh.config.tp_degree == 1  # TP slices after the draw: blocks are finished after it
    dit_seed = seed + (REF2VA_RANDOM_SEED_OFFSET if partition == "Ref2VA" else 0)
    dit = build_random_minimax_h3_dit(
        dit_config,
        dit_seed,
        device,
        dtype,
        attn_impl=attn_impl,
        init_on_device=on_device,
        after_block=finish if dense else None,
    )
    runtime.parallelize(dit, MINIMAX_H3)
    if not dense:
        for index in range(len(dit.blocks)):
            finish(dit, index)
    video_vae = random_video_vae(config, seed=seed, device=device, dtype=dtype, init_on_device=on_device)
    audio_vae = random_audio_vae(config, seed=seed, device=device, init_on_device=on_device)
    tokenizer = load_tokenizer(None)
    return MiniMaxH3Pipeline(
        dit,
        Qwen3VLPromptEncoder(tokenizer, encoder, streamed_from=where.text_encoder, device=device),
        VideoDecoder(
            video_vae,
            f"{video_vae.weights_source}: AutoencoderKLMiniMaxH3 (diffusers)",
            lend_to=where.lend_vae_to(device),
        ),
        AudioDecoder(
            audio_vae,
            f"{audio_vae.weights_source}: AutoencoderKLMiniMaxH3Audio (diffusers)",
            lend_to=where.lend_vae_to(device),
        ),
        device=device,
        patch_size=tuple(dit_config.patch_size),
        timestep_scale=timestep_scale,
        partition=partition,
        weights={
            "summary": f"{RANDOM}, {config} sizes" + ("" if partition == "FL2VA" else f", {partition} DiT"),
            "dit": getattr(dit, "weights_source", RANDOM)
            + ("" if partition == "FL2VA" else f" ({partition}: seed {dit_seed})"),
            "text_encoder": RANDOM + _streamed_note(where.text_encoder, text_layers),
            "tokenizer": tokenizer.description,
            "video_vae": f"{RANDOM}, {config} sizes (diffusers AutoencoderKLMiniMaxH3)",
            "audio_vae": f"{RANDOM}, {config} sizes (diffusers AutoencoderKLMiniMaxH3Audio)",
        },
        show_progress=show_progress,
    )


def _from_checkpoint(
    checkpoint: Path,
    *,
    runtime: Runtime,
    attn_impl,
    timestep_scale,
    show_progress,
    where: Where,
    qkv_layout: str | None,
    quantization: str,
    partition: str = "FL2VA",
) -> MiniMaxH3Pipeline:
    device, dtype = runtime.device, runtime.dtype
    part = resolve_partition(checkpoint, partition)
    video_vae = load_video_vae(_first_dir(part, "video_vae", "vae"), device=device, dtype=dtype)
    audio_vae = load_audio_vae(_first_dir(part, "audio_vae"), device=device)
    from telefuser.models.minimax_h3.checkpoint import load_minimax_h3_dit

    tokenizer_dir = next((part / n for n in ("processor", "tokenizer") if (part / n).is_dir()), None)
    tokenizer = load_tokenizer(tokenizer_dir)
    encoder = MiniMaxH3TextEncoder.from_checkpoint(
        part / "text_encoder", device=device, dtype=dtype, host_from=where.text_encoder
    )
    dit = load_minimax_h3_dit(
        part / "transformer",
        device=device,
        dtype=dtype,
        attn_impl=attn_impl,
        qkv_layout=qkv_layout,
        parallelize=lambda dit: runtime.parallelize(dit, MINIMAX_H3),  # before the read: a TP rank reads its slices
        after_block=where.finish_block(quantization),
    )
    config = getattr(dit, "config", None)
    patch_size = tuple(getattr(config, "patch_size", (1, 2, 2)))
    return MiniMaxH3Pipeline(
        dit,
        Qwen3VLPromptEncoder(tokenizer, encoder, streamed_from=where.text_encoder, device=device),
        VideoDecoder(video_vae, video_vae.weights_source, lend_to=where.lend_vae_to(device)),
        AudioDecoder(audio_vae, audio_vae.weights_source, lend_to=where.lend_vae_to(device)),
        device=device,
        patch_size=patch_size,
        timestep_scale=timestep_scale,
        partition=partition,
        weights={
            "summary": str(part),
            "dit": f"{part / 'transformer'} ({getattr(dit, 'checkpoint_layout', 'layout not recorded')})",
            "text_encoder": f"{part / 'text_encoder'} (first {SELECTED_LAYER} language layers)"
            + _streamed_note(where.text_encoder, SELECTED_LAYER),
            "tokenizer": tokenizer.description,
            "video_vae": video_vae.weights_source,
            "audio_vae": audio_vae.weights_source,
        },
        show_progress=show_progress,
    )


def _streamed_note(resident: int | None, layers: int) -> str:
    if resident is None:
        return ""
    return f", layers {resident}/{layers} resident, the rest streamed from host memory per prompt"
