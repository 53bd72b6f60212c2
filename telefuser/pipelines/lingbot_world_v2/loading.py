"""Assemble a `WorldSessionPipeline` from a checkpoint folder (original or diffusers layout) or from random weights.

Every path is checked before any weight is read, so a wrong folder fails at once with the list of what is missing;
the layouts are in this folder's README. The LingBot DiT package is imported inside the functions: this package
imports (and its tests run) without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ...dtypes import torch_dtype
from ...memory.plan import Placement
from ...memory.streaming import block_finisher
from ...models.lingbot_world_v2.spec import CUDA_GRAPHS, LINGBOT_WORLD_V2
from ...ops.fp8 import QUANTIZATIONS
from ...runtime import Runtime
from ..wan.components import DIFFUSERS_SUBDIRS as WAN_DIFFUSERS_SUBDIRS
from ..wan.components import component_paths, is_diffusers_layout, text_and_vae
from ..wan.text_encoder import TEXT_LEN, UMT5PromptEncoder
from .camera_control import CameraFactory, lingbot_camera
from .session import WorldSessionPipeline

DIT_SUBDIR = "transformers"  # the original layout's DiT folder (the DiT's shards may also sit at the root)
DIFFUSERS_SUBDIRS = {**WAN_DIFFUSERS_SUBDIRS, "dit": "transformer"}
OFFICIAL_RESOLUTION, TINY_RESOLUTION = "832x480", "128x96"  # the released canvas; the tiny demo's


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
    paths = component_paths(root)
    if is_diffusers_layout(root):
        paths["dit"] = root / DIFFUSERS_SUBDIRS["dit"]
        missing = [str(p) for p in paths.values() if not p.is_dir()]
    else:
        paths["dit"] = root / DIT_SUBDIR if (root / DIT_SUBDIR).is_dir() else root
        missing = [str(p) for key, p in paths.items() if key != "dit" and not p.exists()]
    if missing:
        raise FileNotFoundError(f"{root} is not a LingBot-World v2 checkpoint folder; missing: {', '.join(missing)}")
    return paths


def pipeline_from_args(args: argparse.Namespace, runtime: Runtime, **overrides) -> WorldSessionPipeline:
    """The pipeline the LingBot-World v2 flags in `args` describe (`LINGBOT_WORLD_V2.flags`; a flag `args` lacks takes
    its default), on `runtime`'s device, dtype and layout; `overrides` are `build_lingbot_pipeline` keywords that
    replace or add to those. --attn-impl (auto included) is resolved and agreed by all ranks
    (`LINGBOT_WORLD_V2.attention_impl`) unless `overrides` names the implementation."""
    options = LINGBOT_WORLD_V2.options(args, "config", "checkpoint", "quantization", "vae_fast")
    if "attn_impl" not in overrides:
        options["attn_impl"] = LINGBOT_WORLD_V2.attention_impl(args, runtime)
    options["vae_dtype"] = torch_dtype(LINGBOT_WORLD_V2.option(args, "vae_dtype"))
    if "placement" not in overrides:
        options["placement"] = LINGBOT_WORLD_V2.memory_plan(args, runtime, request_from_args(args)).placement
    placement = overrides.get("placement", options.get("placement"))
    streams_blocks = placement is not None and placement.streams("dit")
    options["cuda_graphs"] = not streams_blocks and cuda_graphs_wanted(
        LINGBOT_WORLD_V2.option(args, "cuda_graphs"), runtime.device, runtime.world_size
    )
    return build_lingbot_pipeline(**{**options, "runtime": runtime, **overrides})


def request_from_args(args: argparse.Namespace) -> dict:
    """The session an entry point's flags describe (`run_i2v.py`'s --resolution, --num-frames, --fps; a service's
    --max-sessions), with the model's defaults for those it lacks: what the memory plan is made for."""
    from .request import DEFAULT_FPS, DEFAULT_NUM_FRAMES

    tiny = LINGBOT_WORLD_V2.option(args, "checkpoint") is None and LINGBOT_WORLD_V2.option(args, "config") == "tiny"
    return {
        "resolution": getattr(args, "resolution", None) or (TINY_RESOLUTION if tiny else OFFICIAL_RESOLUTION),
        "num_frames": getattr(args, "num_frames", None) or DEFAULT_NUM_FRAMES,
        "fps": getattr(args, "fps", None) or DEFAULT_FPS,
        "sessions": getattr(args, "max_sessions", None) or 1,
    }


def build_lingbot_pipeline(
    *,
    config: str = "tiny",
    checkpoint: str | Path | None = None,
    runtime: Runtime | None = None,
    seed: int = 0,
    attn_impl: str = "sdpa",
    camera_factory: CameraFactory | None = None,
    condition_encoding: str = "per_chunk",
    vae_dtype: torch.dtype = torch.float32,
    vae_fast: bool = False,
    quantization: str = "none",
    cuda_graphs: bool = False,
    placement: Placement | None = None,
) -> WorldSessionPipeline:
    """`config` ("tiny" | "official") picks random-weight sizes without `checkpoint`.

    `runtime` (None: one rank, `Runtime.one_rank("cpu", torch.bfloat16)`) gives the device, the layout the DiT is
    parallelized over (`Runtime.parallelize` with this model's spec) and the dtype: the DiT's and text encoder's.
    `vae_dtype` is the VAE's, for the condition encode and the decode (float32 by default, as the reference runs it;
    bfloat16 is faster, see docs/perf). `vae_fast` puts the VAE's weights in channels-last and compiles each norm +
    SiLU pair into one kernel (`vae_fusion`; the same result up to rounding order).
    `camera_factory` defaults to the model package's camera features.
    `quantization` "fp8" runs the DiT blocks' projection and FFN GEMMs in FP8 (`LingBotWorldV2DiT.quantize`).
    `cuda_graphs` replays every chunk's forwards as CUDA graphs on a CUDA device (`cuda_graphs_wanted` decides it from
    the command line); a warm-up session then captures them all.
    `placement` (a `memory.plan.Placement`; None: everything on the device) says which layers of the ``text_encoder``
    and ``dit`` stacks stay on the device; the others go to pinned host memory as they load, one tensor or block
    at a time, and stream while they run (`UMT5PromptEncoder`, `LingBotWorldV2DiT.stream_blocks`; not with CUDA graphs).
    """
    if runtime is None:
        runtime = Runtime.one_rank("cpu", torch.bfloat16)
    device, dtype = runtime.device, runtime.dtype
    if config not in ("tiny", "official"):
        raise ValueError(f"config must be 'tiny' or 'official', got {config!r}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    paths = resolve_checkpoint(checkpoint) if checkpoint is not None else None  # fail before reading weights
    size = "official" if paths is not None else config
    text_resident = placement.resident_layers("text_encoder") if placement is not None else None
    dit_resident = placement.resident_layers("dit") if placement is not None else None
    if cuda_graphs and dit_resident is not None:
        raise ValueError("streamed DiT blocks (--offload block) cannot replay as CUDA graphs; pass --cuda-graphs off")
    vae, tokenizer, encoder, weights = text_and_vae(
        size,
        checkpoint,
        paths,
        device=device,
        dtype=dtype,
        vae_dtype=vae_dtype,
        seed=seed,
        text_from=text_resident,
        tiny_text_dim=_tiny_text_dim(),
    )
    model, text_dim, text_len = _build_dit(
        size,
        paths,
        runtime,
        seed=seed,
        attn_impl=attn_impl,
        finish=block_finisher(quantization, dit_resident),
    )
    weights["dit"] = getattr(model, "weights_source", weights["dit"])
    if quantization != "none":
        model.weights_source = weights["dit"] = f"{model.weights_source}, fp8 GEMMs"
    if dit_resident is not None:
        moved = model.stream_blocks(device, resident=dit_resident)
        weights["dit"] += (
            f"; blocks {dit_resident}/{len(model.blocks)} resident, the rest streamed ({moved / 2**30:.2f} GiB)"
        )
    if placement is not None:
        weights["placement"] = f"--offload {placement.tier}"
    if cuda_graphs and device.type == "cuda":
        model.enable_cuda_graphs()
    if int(encoder.config.d_model) != text_dim:
        raise ValueError(f"text encoder width {encoder.config.d_model} != DiT text_dim {text_dim}")
    if vae_fast:
        from ..wan.vae_fusion import optimize_vae

        optimize_vae(vae.model)
        vae.description += ", channels-last, fused norm+SiLU"
        weights["vae"] = vae.description
    if camera_factory is None:
        camera_factory = lingbot_camera()
    mesh = runtime.mesh
    vae_group = mesh.ulysses_group if mesh is not None and mesh.config.ulysses_degree > 1 else None
    return WorldSessionPipeline(
        model,
        UMT5PromptEncoder(tokenizer, encoder, text_len=text_len, streamed_from=text_resident, device=device),
        vae,
        device=device,
        dit_dtype=dtype,
        camera_factory=camera_factory,
        vae_group=vae_group,
        condition_encoding=condition_encoding,
        weights=weights,
    )


def _tiny_text_dim() -> int:
    from telefuser.models.lingbot_world_v2.config import LingBotWorldV2Config

    return int(LingBotWorldV2Config.tiny_session().text_dim)


def _build_dit(size, paths, runtime: Runtime, *, seed, attn_impl, finish):
    """(dit, text_dim, text_len) from the model package (imported here, lazily), each block finished as it loads,
    parallelized over `runtime`'s layout."""
    from telefuser.models.lingbot_world_v2.checkpoint import build_random_lingbot_dit, load_lingbot_dit
    from telefuser.models.lingbot_world_v2.config import LingBotWorldV2Config

    device, dtype = runtime.device, runtime.dtype
    if paths is not None:
        model = load_lingbot_dit(paths["dit"], device=device, dtype=dtype, attn_impl=attn_impl, after_block=finish)
    else:
        dit_config = LingBotWorldV2Config.tiny_session() if size == "tiny" else LingBotWorldV2Config()
        # on a GPU, draw there: the 14B official DiT takes minutes to draw on the host
        model = build_random_lingbot_dit(
            dit_config,
            seed,
            device,
            dtype,
            attn_impl=attn_impl,
            init_on_device=device.type == "cuda",
            after_block=finish,
        )
    runtime.parallelize(model, LINGBOT_WORLD_V2)
    config = model.config
    return model, int(config.text_dim), int(getattr(config, "text_len", TEXT_LEN))
