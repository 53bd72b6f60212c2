"""The flags several models share, declared here once; a model's `spec.py` picks them with its own options.

Plain data (no torch): the services build their command lines from these without importing a model.
"""

from __future__ import annotations

from pathlib import Path

from ..arg_types import positive_float
from ..dtypes import DTYPE_NAMES
from ..ops.attention_registry import AUTO, offered_names
from .spec import Flag

SIZES = ("tiny", "official")
# The attention backends a model runs with (the registry's, less the test-only "identity"; the registry's names import
# no torch); which are installed is checked when the model is built.
ATTENTION_IMPLS = offered_names()
AUTO_ATTENTION = AUTO  # resolved to a spec's `auto_attention` preference (ModelSpec.attention_impl)
QUANTIZATIONS = ("none", "fp8")  # telefuser.ops.fp8.QUANTIZATIONS


def config_flag() -> Flag:
    return Flag(
        ("--config",), {"choices": SIZES, "default": "tiny", "help": "random-weight sizes without --checkpoint"}
    )


def checkpoint_flag(help: str) -> Flag:
    return Flag(("--checkpoint",), {"type": Path, "default": None, "help": help})


def attn_impl_flag(
    choices: tuple[str, ...] = ATTENTION_IMPLS, *, default: str = "sdpa", auto: tuple[str, ...] = ("sdpa",)
) -> Flag:
    """--attn-impl: one of `choices`, checked to be installed, or "auto": the first of `auto` (the spec's
    `auto_attention`) that this machine runs."""
    return Flag(
        ("--attn-impl",),
        {
            "choices": (*choices, AUTO_ATTENTION),
            "default": default,
            "help": f"attention implementation, checked to be installed (default %(default)s); {AUTO_ATTENTION}: the "
            f"first of {', '.join(auto)} usable on this machine and device, agreed by all ranks",
        },
    )


def quantization_flag(help: str, choices: tuple[str, ...] = QUANTIZATIONS) -> Flag:
    return Flag(("--quantization",), {"choices": choices, "default": "none", "help": help})


OFFLOAD_TIERS = ("auto", "none", "model", "block")  # telefuser.memory.plan: AUTO and TIERS


def offload_flag() -> Flag:
    return Flag(
        ("--offload",),
        {
            "choices": OFFLOAD_TIERS,
            "default": "auto",
            "help": "where weights live (default %(default)s: the cheapest tier that fits the device, checked before "
            "anything loads); none: all on the GPU; model: what runs once per request (the text encoder, MiniMax "
            "H3's AdaLN projections) streams from pinned host memory a layer at a time, and Wan 2.2 T2V-A14B keeps "
            "only its running expert on the GPU; block: the DiT's blocks stream too, each block's copy overlapping "
            "the previous block's compute. Leftover memory keeps leading layers resident. "
            "`telefuser plan` shows the plan",
        },
    )


def gpu_memory_flag() -> Flag:
    return Flag(
        ("--gpu-memory-gb",),
        {
            "type": positive_float,
            "default": None,
            "metavar": "GIB",
            "help": "GPU memory this process may use, in GiB (default: the device's free memory): the plan fits 90%% "
            "of it and the process is held to it (torch.cuda.set_per_process_memory_fraction)",
        },
    )


def vae_dtype_flag(help: str) -> Flag:
    """--vae-dtype: the Wan VAE's dtype (float32 by default, as the references run it)."""
    return Flag(("--vae-dtype",), {"choices": DTYPE_NAMES, "default": "float32", "help": help})
