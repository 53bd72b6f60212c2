"""The flags several models share, declared here once; a model's `spec.py` picks them with its own options.

Plain data (no torch): the services build their command lines from these without importing a model.
"""

from __future__ import annotations

from pathlib import Path

from .spec import Flag

SIZES = ("tiny", "official")
# The attention implementations a model runs with (telefuser.ops.attention.ATTENTION_IMPLS, less the test-only
# "identity"); which are installed is checked when the model is built.
ATTENTION_IMPLS = ("sdpa", "flash_attn_4", "sage", "cudnn_fp8", "sage_sm90")
AUTO_ATTENTION = "auto"  # telefuser.ops.attention.AUTO: resolved to a spec's `auto_attention` preference
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
