"""Assemble a `WorldSessionPipeline` from a checkpoint folder (original or diffusers layout) or from random weights.

Every path is checked before any weight is read, so a wrong folder fails at once with the list of what is missing;
the layouts are in this folder's README. The LingBot DiT package is imported inside the functions: this package
imports (and its tests run) without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ...models.lingbot_world_v2.spec import CUDA_GRAPHS, LINGBOT_WORLD_V2
from ...ops.fp8 import QUANTIZATIONS
from ...runtime import Runtime, torch_dtype
from .camera_control import CameraFactory, lingbot_camera
from .session import WorldSessionPipeline
from .text_encoder import (
    OFFICIAL_UMT5,
    TEXT_LEN,
    TOKENIZER_SUBDIR,
    PromptEncoder,
    build_umt5_encoder,
    load_official_umt5,
    load_pretrained_umt5,
    load_tokenizer,
    tiny_umt5_config,
)
from .vae import WanVideoVAE

RANDOM = "random (no checkpoint)"
VAE_FILE = "Wan2.1_VAE.pth"
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
DIT_SUBDIR = "transformers"
DIFFUSERS_SUBDIRS = {"vae": "vae", "text_encoder": "text_encoder", "tokenizer": "tokenizer", "dit": "transformer"}
TINY_WINDOW = {"local_attn_size": 10, "sink_size": 2}


def cuda_graphs_wanted(choice: str, device, ulysses_degree: int = 1) -> bool:
    """--cuda-graphs: ``on`` replays steady chunks as CUDA graphs on a CUDA device
    (`LingBotWorldV2DiT.enable_cuda_graphs`), ``off`` runs every forward eagerly, ``auto`` (the default) replays them
    under Ulysses on CUDA only: with one compiled region per block a single-GPU forward keeps the host ahead of the
    device and graphs measured level there, while under Ulysses they measured faster (docs/perf). ``on`` elsewhere is
    an error."""
    if choice not in CUDA_GRAPHS:
        raise ValueError(f"cuda graphs must be one of {CUDA_GRAPHS}, got {choice!r}")
    cuda = torch.device(device).type == "cuda"
    if choice == "on" and not cuda:
        raise ValueError(f"--cuda-graphs on needs a CUDA device, got {device}")
    return cuda and (choice == "on" or (choice == "auto" and ulysses_degree > 1))


def resolve_checkpoint(checkpoint: str | Path) -> dict[str, Path]:
    """{vae, text_encoder, tokenizer, dit} paths of a checkpoint folder in either layout (see README.md);
    FileNotFoundError naming every missing one."""
    root = Path(checkpoint)
    if is_diffusers_layout(root):
        paths = {part: root / sub for part, sub in DIFFUSERS_SUBDIRS.items()}
        missing = [str(p) for p in paths.values() if not p.is_dir()]
    else:
        paths = {
            "vae": root / VAE_FILE,
            "text_encoder": root / T5_FILE,
            "tokenizer": root / TOKENIZER_SUBDIR,
            "dit": root / DIT_SUBDIR if (root / DIT_SUBDIR).is_dir() else root,
        }
        missing = [str(p) for key, p in paths.items() if key != "dit" and not p.exists()]
    if missing:
        raise FileNotFoundError(f"{root} is not a LingBot-World v2 checkpoint folder; missing: {', '.join(missing)}")
    return paths


def is_diffusers_layout(root: Path) -> bool:
    return (root / "model_index.json").is_file()


def pipeline_from_args(args: argparse.Namespace, runtime: Runtime, **overrides) -> WorldSessionPipeline:
    """The pipeline the LingBot-World v2 flags in `args` describe (`LINGBOT_WORLD_V2.flags`; a flag `args` lacks takes
    its default), on `runtime`'s device, dtype and layout; `overrides` are `build_lingbot_pipeline` keywords that
    replace or add to those. --attn-impl (auto included) is resolved and agreed by all ranks
    (`LINGBOT_WORLD_V2.attention_impl`) unless `overrides` names the implementation."""
    options = LINGBOT_WORLD_V2.options(args, "config", "checkpoint", "quantization", "vae_fast")
    if "attn_impl" not in overrides:
        options["attn_impl"] = LINGBOT_WORLD_V2.attention_impl(args, runtime)
    options["vae_dtype"] = torch_dtype(LINGBOT_WORLD_V2.option(args, "vae_dtype"))
    options["cuda_graphs"] = cuda_graphs_wanted(
        LINGBOT_WORLD_V2.option(args, "cuda_graphs"), runtime.device, runtime.world_size
    )
    launch = {"device": runtime.device, "dtype": runtime.dtype, "mesh": runtime.mesh}
    return build_lingbot_pipeline(**{**options, **launch, **overrides})


def build_lingbot_pipeline(
    *,
    config: str = "tiny",
    checkpoint: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    mesh=None,
    seed: int = 0,
    attn_impl: str = "sdpa",
    camera_factory: CameraFactory | None = None,
    condition_encoding: str = "per_chunk",
    vae_dtype: torch.dtype = torch.float32,
    vae_fast: bool = False,
    quantization: str = "none",
    cuda_graphs: bool = False,
) -> WorldSessionPipeline:
    """`config` ("tiny" | "official") picks random-weight sizes without `checkpoint`.

    `dtype` is the DiT's and text encoder's; `vae_dtype` the VAE's, for the condition encode and the decode (float32
    by default, as the reference runs it; bfloat16 is faster, see docs/perf). `vae_fast`
    puts the VAE's weights in channels-last and compiles each norm + SiLU pair into one kernel (`vae_fusion`; the
    same result up to rounding order).
    `camera_factory` defaults to the model package's camera features.
    `quantization` "fp8" runs the DiT blocks' projection and FFN GEMMs in FP8 (`LingBotWorldV2DiT.quantize`).
    `cuda_graphs` replays every chunk's forwards as CUDA graphs on a CUDA device (`cuda_graphs_wanted` decides it from
    the command line); a warm-up session then captures them all.
    """
    device = torch.device(device)
    if config not in ("tiny", "official"):
        raise ValueError(f"config must be 'tiny' or 'official', got {config!r}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    paths = resolve_checkpoint(checkpoint) if checkpoint is not None else None  # fail before reading weights
    size = "official" if paths is not None else config
    model, text_dim, text_len = _build_dit(
        size, paths, device=device, dtype=dtype, mesh=mesh, seed=seed, attn_impl=attn_impl
    )
    if quantization != "none":
        model.quantize(quantization)
    if cuda_graphs and device.type == "cuda":
        model.enable_cuda_graphs()
    vae, tokenizer, encoder, weights = _text_and_vae(
        model, size, checkpoint, paths, device=device, dtype=dtype, vae_dtype=vae_dtype, seed=seed, text_dim=text_dim
    )
    if int(encoder.config.d_model) != text_dim:
        raise ValueError(f"text encoder width {encoder.config.d_model} != DiT text_dim {text_dim}")
    if vae_fast:
        from .vae_fusion import optimize_vae

        optimize_vae(vae.model)
        vae.description += ", channels-last, fused norm+SiLU"
        weights["vae"] = vae.description
    if camera_factory is None:
        camera_factory = lingbot_camera()
    vae_group = mesh.ulysses_group if mesh is not None and mesh.config.ulysses_degree > 1 else None
    return WorldSessionPipeline(
        model,
        PromptEncoder(tokenizer, encoder, text_len=text_len),
        vae,
        device=device,
        dit_dtype=dtype,
        camera_factory=camera_factory,
        vae_group=vae_group,
        condition_encoding=condition_encoding,
        weights=weights,
    )


def _text_and_vae(model, size, checkpoint, paths, *, device, dtype, vae_dtype, seed, text_dim):
    """(vae, tokenizer, text encoder, the weights' description): from the checkpoint (official or diffusers layout),
    or random at `size` without one."""
    if paths is None:
        vae = WanVideoVAE.random(size, seed=seed, device=device, dtype=vae_dtype)
        tokenizer = load_tokenizer(None)
        text_config = OFFICIAL_UMT5 if size == "official" else tiny_umt5_config(text_dim)
        encoder = build_umt5_encoder(text_config, seed=seed, device=device, dtype=dtype)
        sources = {"summary": f"{RANDOM}, {size} sizes", "dit": getattr(model, "weights_source", RANDOM)}
        sources["text_encoder"] = RANDOM
    else:
        if is_diffusers_layout(Path(checkpoint)):
            vae = WanVideoVAE.from_pretrained(paths["vae"], device=device, dtype=vae_dtype)
            encoder = load_pretrained_umt5(paths["text_encoder"], device=device, dtype=dtype)
        else:
            vae = WanVideoVAE.from_official(paths["vae"], device=device, dtype=vae_dtype)
            encoder = load_official_umt5(paths["text_encoder"], device=device, dtype=dtype)
        tokenizer = load_tokenizer(paths["tokenizer"])
        sources = {"summary": str(checkpoint), "dit": getattr(model, "weights_source", str(paths["dit"]))}
        sources["text_encoder"] = str(paths["text_encoder"])
    weights = {**sources, "tokenizer": tokenizer.description, "vae": vae.description}
    return vae, tokenizer, encoder, weights


def _build_dit(size, paths, *, device, dtype, mesh, seed, attn_impl):
    """(dit, text_dim, text_len) from the model package (imported here, lazily)."""
    from telefuser.models.lingbot_world_v2.checkpoint import build_random_lingbot_dit, load_lingbot_dit
    from telefuser.models.lingbot_world_v2.config import LingBotWorldV2Config

    if paths is not None:
        model = load_lingbot_dit(paths["dit"], device=device, dtype=dtype, attn_impl=attn_impl)
    else:
        # tiny: a 10-frame window with 2 sink frames, so 4-latent chunks fit and the window rolls from chunk 3 on
        dit_config = LingBotWorldV2Config.tiny(**TINY_WINDOW) if size == "tiny" else LingBotWorldV2Config()
        # on a GPU, draw there: the 14B official DiT takes minutes to draw on the host
        model = build_random_lingbot_dit(
            dit_config, seed, device, dtype, attn_impl=attn_impl, init_on_device=device.type == "cuda"
        )
    Runtime(mesh, device, dtype).parallelize(model)
    config = model.config
    return model, int(config.text_dim), int(getattr(config, "text_len", TEXT_LEN))
