"""The Wan release's text encoder, tokenizer and VAE, found in either checkpoint layout or drawn at random.

The original layout keeps them as files at the root (``Wan2.1_VAE.pth``, ``models_t5_umt5-xxl-enc-bf16.pth``,
``google/umt5-xxl/``); diffusers' layout (``model_index.json``) as ``vae/``, ``text_encoder/`` and ``tokenizer/``
folders, each read with its library's loader. Every Wan-family pipeline (LingBot-World v2, Wan 2.2) loads them here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .text_encoder import (
    OFFICIAL_UMT5,
    TOKENIZER_SUBDIR,
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
DIFFUSERS_SUBDIRS = {"vae": "vae", "text_encoder": "text_encoder", "tokenizer": "tokenizer"}


def is_diffusers_layout(root: Path) -> bool:
    return (root / "model_index.json").is_file()


def component_paths(root: Path, vae_file: str = VAE_FILE) -> dict[str, Path]:
    """{vae, text_encoder, tokenizer} of a checkpoint folder in either layout (not checked to exist)."""
    if is_diffusers_layout(root):
        return {part: root / sub for part, sub in DIFFUSERS_SUBDIRS.items()}
    return {"vae": root / vae_file, "text_encoder": root / T5_FILE, "tokenizer": root / TOKENIZER_SUBDIR}


def text_and_vae(
    size: str,
    checkpoint: str | Path | None,
    paths: dict[str, Path] | None,
    *,
    device,
    dtype: torch.dtype,
    vae_dtype: torch.dtype,
    seed: int,
    text_from: int | None,
    tiny_text_dim: int,
    vae_kind: str = "wan2.1",
):
    """(vae, tokenizer, text encoder, the weights' description): from the checkpoint's `paths` (either layout), or
    random at `size` ("tiny" | "official"; a tiny encoder `tiny_text_dim` wide) without one. `text_from`: the
    encoder's blocks from there on (and its embedding) load into host memory, to stream (None: all on `device`).
    Load them before the DiT: the encoder's device tensors then never share the device with a whole unfinished
    DiT."""
    streamed = "" if text_from is None else f", its first {text_from} blocks resident, the rest streamed per prompt"
    if paths is None:
        vae = WanVideoVAE.random(size, seed=seed, device=device, dtype=vae_dtype, kind=vae_kind)
        tokenizer = load_tokenizer(None)
        text_config = OFFICIAL_UMT5 if size == "official" else tiny_umt5_config(tiny_text_dim)
        encoder = build_umt5_encoder(text_config, seed=seed, device=device, dtype=dtype, host_from=text_from)
        sources = {"summary": f"{RANDOM}, {size} sizes", "dit": RANDOM}
        sources["text_encoder"] = RANDOM + streamed
    else:
        if is_diffusers_layout(Path(checkpoint)):
            vae = WanVideoVAE.from_pretrained(paths["vae"], device=device, dtype=vae_dtype)
            encoder = load_pretrained_umt5(paths["text_encoder"], device=device, dtype=dtype, host_from=text_from)
        else:
            vae = WanVideoVAE.from_official(paths["vae"], device=device, dtype=vae_dtype, kind=vae_kind)
            encoder = load_official_umt5(paths["text_encoder"], device=device, dtype=dtype, host_from=text_from)
        tokenizer = load_tokenizer(paths["tokenizer"])
        sources = {"summary": str(checkpoint), "dit": str(paths.get("dit", checkpoint))}
        sources["text_encoder"] = str(paths["text_encoder"]) + streamed
    weights = {**sources, "tokenizer": tokenizer.description, "vae": vae.description}
    return vae, tokenizer, encoder, weights
