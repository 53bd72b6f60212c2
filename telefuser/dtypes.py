"""The dtype names the command lines take, and their torch dtypes. A leaf module: model specs and the launch context
both import it, and it imports nothing of ours (nor torch, until a name is converted)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("bfloat16", "float16", "float32")


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``, for the names in DTYPE_NAMES."""
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {name!r}")
    return getattr(torch, name)
