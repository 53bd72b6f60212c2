"""The services' start-up warm-up switch: one flag, one rule, so both services decide it the same way."""

from __future__ import annotations

import argparse


def add_warmup_arg(group, *, what: str) -> None:
    group.add_argument(
        "--warmup",
        choices=("auto", "on", "off"),
        default="auto",
        help=f"run {what} at start-up, so the first client does not pay for kernel compilation (default auto: on "
        "for CUDA)",
    )


def warmup_wanted(args: argparse.Namespace, device) -> bool:
    """--warmup on, or auto on a CUDA device. Every rank decides from the same arguments, so all warm up or none."""
    warmup = getattr(args, "warmup", "auto")
    return warmup == "on" or (warmup == "auto" and str(device).startswith("cuda"))
