"""LingBot-World v2's memory workload: sessions on one rank, as `memory.plan` weighs them.

The weights are the Wan family's terms (`pipelines.wan.memory`): the DiT (its blocks in FP8 where `--quantization fp8`
puts them), the umT5 encoder, the Wan 2.1 VAE. A session holds its KV window (the layout its attention implementation
keeps: bf16, FP8 keys for ``cudnn_fp8``, the ``sage_sm90`` window) and its latents; a service holds
`request["sessions"]` of them. The per-chunk terms are formulas over the session's shape, calibrated against measured
peaks (serving/README.md and docs/perf).

Stacks: ``dit`` (its blocks stream in the block tier), ``text_encoder`` (umT5: once per session; its token embedding
is looked up on the host once offloaded), ``vae`` (never streamed). Stages: ``text``, ``condition`` (the VAE encode
of the reference image), ``chunk`` (the DiT forwards), ``decode``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import torch

from ...memory.plan import Stack, Stage, Workload
from ..wan.memory import dit_bytes, prompt_activation_bytes, umt5_stack, vae_terms
from ..wan.vae import LATENT_CHANNELS
from .request import DEFAULT_FPS, DEFAULT_NUM_FRAMES, plan_session
from .session import MASK_CHANNELS

# One chunk's DiT phase, per query row on a rank, in dim-wide elements of the compute dtype: every block's camera scale
# and shift (2 x layers, computed once a chunk) plus ACTIVATION_ROW_FACTOR for the forward. Calibrated: the official
# 832x480 bf16 session's DiT phase peaked 8.1 GiB above its weights and window on the H100 (docs/perf/2026-12-06).
ACTIVATION_ROW_FACTOR = 56
# The Wan VAE's encode and decode of one chunk, in full-resolution maps of base_dim channels per frame of the chunk,
# in the VAE's dtype: 4.8 and 9.6 GiB measured at 832x480, 16 frames, bf16 (2026-12-06).
VAE_ENCODE_MAPS, VAE_DECODE_MAPS = 4.5, 9
# Captured DiT forwards keep their activations in the graphs' private pool for the session, on top of every later stage:
# in rows x dim elements of the compute dtype. Calibrated: the official FP8 session with --cuda-graphs on held 4.2 GiB
# more at its decode than the same session without graphs predicts (H100, docs/perf/2026-12-06).
GRAPH_POOL_ROW_FACTOR = 70
CONDITION_CHANNELS = MASK_CHANNELS + LATENT_CHANNELS  # the DiT's condition input: the mask, the clip's latents


def workload(args, parallel, dtype: torch.dtype, request: Mapping) -> Workload:
    """`request` ({resolution, num_frames, fps, sessions}) with the LingBot flags in `args` on one rank of `parallel`,
    the DiT and text encoder in `dtype`."""
    from ...models.lingbot_world_v2.dit import LingBotWorldV2DiT
    from ...models.lingbot_world_v2.spec import LINGBOT_WORLD_V2

    size = _size(args)
    wan_size = "tiny" if size == "tiny" else "official"  # umT5's and the VAE's: a checkpoint runs the release's
    quantization = LINGBOT_WORLD_V2.option(args, "quantization")
    attn_impl = LINGBOT_WORLD_V2.option(args, "attn_impl")
    vae_dtype = getattr(torch, LINGBOT_WORLD_V2.option(args, "vae_dtype"))
    ulysses = parallel.ulysses_degree
    element = torch.empty((), dtype=dtype).element_size()
    vae_element = torch.empty((), dtype=vae_dtype).element_size()
    config = _dit_config(size)
    text_dim = int(config.text_dim)
    dit = dit_bytes(LingBotWorldV2DiT, config, element, quantization)
    vae = vae_terms("wan2.1", wan_size, vae_element)

    plan = plan_session(
        resolution=request["resolution"],
        num_frames=int(request.get("num_frames", DEFAULT_NUM_FRAMES)),
        fps=float(request.get("fps", DEFAULT_FPS)),
    )
    sessions = int(request.get("sessions", 1))
    local_channels = config.dim // ulysses  # heads / U x head_dim
    window = config.local_attn_size if config.local_attn_size > 0 else plan.latent_frames  # -1: the whole session
    window_rows = max(window, plan.chunk_latent_frames) * plan.tokens_per_frame
    kv = config.num_layers * window_rows * local_channels * window_element_bytes(attn_impl, element)
    cross = 2 * config.num_layers * config.text_len * local_channels * element
    grid = plan.latent_frames * plan.latent_height * plan.latent_width
    rows = plan.chunk_latent_frames * plan.tokens_per_frame
    pixels = plan.width * plan.height
    frames = max(plan.frames_per_chunk)
    frame_maps = frames * pixels * vae.decoder_width * vae_element  # the Wan 2.1 decoder's last stage is base_dim wide

    title = (
        f"LingBot-World v2 {plan.width}x{plan.height}, {sessions} session(s)"
        f" ({_label(size)}, {str(dtype).removeprefix('torch.')}{', fp8 GEMMs' if quantization == 'fp8' else ''},"
        f" attention {attn_impl}, ulysses {ulysses})"
    )
    cuda_graphs = LINGBOT_WORLD_V2.option(args, "cuda_graphs")
    refused = {}
    if cuda_graphs == "on":
        refused["block"] = "CUDA graphs cannot replay streamed blocks; pass --cuda-graphs off (or auto)"
    # auto captures under Ulysses unless blocks stream: counted for every tier then, the block tier's estimate errs high
    graphs = cuda_graphs == "on" or (cuda_graphs == "auto" and ulysses > 1)
    held = {
        "kv windows": sessions * (kv + cross),
        "latents": sessions * (LATENT_CHANNELS + CONDITION_CHANNELS) * grid * 4,
    }
    if graphs:
        held["CUDA graph pools"] = sessions * -(-rows // ulysses) * GRAPH_POOL_ROW_FACTOR * config.dim * element
    return Workload(
        title=title,
        stacks=(
            Stack("dit", fixed=dit.fixed, layer=dit.block, count=dit.count),
            umt5_stack(wan_size, text_dim, element),
            Stack("vae", fixed=vae.weight_bytes),
        ),
        held=held,
        stages=(
            Stage(
                "text",
                uses=("text_encoder",),
                transient={"prompt activations": prompt_activation_bytes(wan_size, text_dim, element)},
            ),
            Stage("condition", uses=("vae",), transient={"encode": int(VAE_ENCODE_MAPS * frame_maps)}),
            Stage(
                "chunk",
                uses=("dit",),
                transient={
                    "camera modulation and activations": -(-rows // ulysses)
                    * (2 * config.num_layers + ACTIVATION_ROW_FACTOR)
                    * config.dim
                    * element
                },
            ),
            Stage("decode", uses=("vae",), transient={"decode": VAE_DECODE_MAPS * frame_maps}),
        ),
        refused_tiers=refused,
    )


def window_element_bytes(attn_impl: str, element: int) -> int:
    """Bytes of one key and one value element in a session's window, in the format `attn_impl` keeps
    (window_formats.format_for): both in the model's dtype (plain); e4m3 keys (`Fp8KeyWindow`, ``cudnn_fp8``); int8
    keys, e4m3 values and the keys in the model's dtype (`SageWindow`, ``sage_sm90``). ``auto`` counts a plain
    window, the largest (LingBot's auto resolves to sdpa)."""
    from ...models.flags import AUTO_ATTENTION
    from ...models.lingbot_world_v2.window_formats import FP8_KEY_WINDOW, PLAIN_WINDOW, SAGE_WINDOW, format_for

    window_format = PLAIN_WINDOW if attn_impl == AUTO_ATTENTION else format_for(attn_impl)
    if window_format is FP8_KEY_WINDOW:
        return 1 + element
    if window_format is SAGE_WINDOW:
        return 1 + 1 + element
    return 2 * element


def alternatives(args, parallel, dtype: torch.dtype, request: Mapping) -> list[tuple[str, Workload]]:
    """What a refusal may suggest: FP8 GEMMs (with FP8 keys), twice the Ulysses degree (it splits the KV window by
    heads), fewer sessions, a 416x240 canvas."""
    import argparse

    from ...distributed.mesh import ParallelConfig

    out = []
    if getattr(args, "quantization", "none") != "fp8":
        fp8 = argparse.Namespace(**{**vars(args), "quantization": "fp8", "attn_impl": "cudnn_fp8"})
        out.append(("--quantization fp8 --attn-impl cudnn_fp8", workload(fp8, parallel, dtype, request)))
    config = _dit_config(_size(args))
    ulysses = parallel.ulysses_degree * 2
    if config.num_heads % ulysses == 0:
        wider = ParallelConfig(ulysses_degree=ulysses, tp_degree=1)
        out.append((f"--ulysses-degree {ulysses} ({ulysses} GPUs)", workload(args, wider, dtype, request)))
    if int(request.get("sessions", 1)) > 1:
        out.append(("--max-sessions 1", workload(args, parallel, dtype, {**request, "sessions": 1})))
    if str(request.get("resolution")) != "416x240":
        out.append(("--resolution 416x240", workload(args, parallel, dtype, {**request, "resolution": "416x240"})))
    return out


def _size(args) -> str:
    from ...models.lingbot_world_v2.spec import LINGBOT_WORLD_V2

    checkpoint = LINGBOT_WORLD_V2.option(args, "checkpoint")
    return str(checkpoint) if checkpoint is not None else LINGBOT_WORLD_V2.option(args, "config")


def _label(size: str) -> str:
    return size if size in ("tiny", "official") else "checkpoint"


@functools.lru_cache(maxsize=16)
def _dit_config(size: str):
    from ...models.lingbot_world_v2.config import LingBotWorldV2Config

    if size == "tiny":
        return LingBotWorldV2Config.tiny_session()
    if size == "official":
        return LingBotWorldV2Config()
    from ...models.lingbot_world_v2.checkpoint import V2_LOCAL_ATTN_SIZE, V2_SINK_SIZE, find_checkpoint
    from ..wan.components import is_diffusers_layout
    from .loading import DIFFUSERS_SUBDIRS, DIT_SUBDIR

    root = Path(size)
    dit = root / DIFFUSERS_SUBDIRS["dit"] if is_diffusers_layout(root) else root / DIT_SUBDIR
    _, config_path = find_checkpoint(dit if dit.is_dir() else root)
    return LingBotWorldV2Config.from_json(config_path).with_window(V2_LOCAL_ATTN_SIZE, V2_SINK_SIZE)
