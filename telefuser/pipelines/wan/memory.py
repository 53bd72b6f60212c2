"""The Wan family's memory terms: what LingBot-World v2's and Wan 2.2's workloads (`memory.plan`) are built from.

Weights are counted from the modules themselves, built without storage (the DiT on the meta device, umT5 and the VAE
under accelerate's empty weights), in the dtypes they run in: a DiT's non-block tensors and one block (float32 where
`keeps_fp32` loads them, the block linears in FP8 where `--quantization fp8` puts them), umT5 as the text encoder
stack the plan streams, a Wan VAE with its decoder's last stage. umT5's prompt activations are a formula over its
widths. Sizes are ``"tiny"`` (the CPU-sized twins) and ``"official"`` (the release's; a checkpoint runs those).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ...memory.plan import Stack, text_encoder_stack
from ...ops.fp8 import is_block_linear

TEXT_TOKENS = 512  # umT5's text_len: every prompt is padded to it


class DitBytes(NamedTuple):
    """A DiT's weights in bytes (dense: Ulysses does not split them)."""

    fixed: int  # outside the blocks
    block: int  # the largest block
    count: int  # how many blocks


class VaeTerms(NamedTuple):
    """A Wan VAE's weights, and the decoder stage whose maps a decode's memory is counted in."""

    weight_bytes: int
    decoder_width: int  # the decoder's last-stage channels
    decoder_stride: int  # that stage's stride in pixels (the VAE's patch)


@functools.lru_cache(maxsize=16)
def dit_bytes(model_class: type, config, element: int, quantization: str) -> DitBytes:
    """`model_class(config)` on the meta device: float32 where `keeps_fp32` (time embedding, modulation, head), the
    weights of the block linears `model_class.FP8_LINEARS` names in e4m3 where `quantization` is "fp8", every other
    tensor at `element` bytes."""
    from ...models.wan.checkpoint import keeps_fp32

    with torch.device("meta"):
        model = model_class(config)
    fixed, blocks = 0, [0] * len(model.blocks)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        module, _, leaf = name.rpartition(".")
        if keeps_fp32(name):
            nbytes = 4 * tensor.numel()
        elif quantization == "fp8" and leaf == "weight" and is_block_linear(module, model_class.FP8_LINEARS):
            nbytes = tensor.numel() + 4 * tensor.shape[0]  # e4m3 values and an fp32 scale per output row
        else:
            nbytes = element * tensor.numel()
        if name.startswith("blocks."):
            blocks[int(name.split(".")[1])] += nbytes
        else:
            fixed += nbytes
    return DitBytes(fixed, max(blocks), len(blocks))


def umt5_config(size: str, text_dim: int) -> dict:
    """The release's umT5, or the tiny one as wide as the tiny DiT's text input (`text_dim`)."""
    from .text_encoder import OFFICIAL_UMT5, tiny_umt5_config

    return tiny_umt5_config(text_dim) if size == "tiny" else dict(OFFICIAL_UMT5)


@functools.lru_cache(maxsize=16)
def umt5_stack(size: str, text_dim: int, element: int) -> Stack:
    """umT5 as the plan streams it: its non-block tensors (the tied token embedding, the final norm), one block, how
    many blocks."""
    from accelerate import init_empty_weights
    from transformers import UMT5Config, UMT5EncoderModel

    with init_empty_weights():
        model = UMT5EncoderModel(UMT5Config(**umt5_config(size, text_dim)))
    model.tie_weights()  # the token embedding is one tensor, counted once
    layer = sum(p.numel() for p in model.encoder.block[0].parameters()) * element
    total = sum(p.numel() for p in model.parameters()) * element  # tied weights are listed once
    count = len(model.encoder.block)
    return text_encoder_stack(total - count * layer, layer, count)


def prompt_activation_bytes(size: str, text_dim: int, element: int) -> int:
    """umT5's activations while it encodes one prompt."""
    config = umt5_config(size, text_dim)
    return TEXT_TOKENS * (4 * config["d_model"] + 3 * config["d_ff"]) * element


@functools.lru_cache(maxsize=16)
def vae_terms(kind: str, size: str, element: int) -> VaeTerms:
    """The Wan VAE of `kind` ("wan2.1" | "wan2.2", `vae.VAE_CONFIGS`) with its floating tensors at `element` bytes."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLWan

    from .vae import VAE_CONFIGS

    config = VAE_CONFIGS[kind, size]
    with init_empty_weights():
        model = AutoencoderKLWan(**config)
    tensors = [*model.parameters(), *model.buffers()]
    weights = sum(t.numel() * (element if t.is_floating_point() else t.element_size()) for t in tensors)
    width = int(config.get("decoder_base_dim") or config["base_dim"])
    return VaeTerms(weights, width, int(config.get("patch_size") or 1))
