"""Memory-bound elementwise chains compiled into single kernels on CUDA.

`cuda_fused(fn)` runs `fn` itself on the CPU (the reference) and ``torch.compile(fn)`` for CUDA inputs, so a chain of
norms, modulation and RoPE costs one pass over the activation instead of one per op. ``TELEFUSER_FUSION=0`` turns it
off everywhere (this folder's README).
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

_state = {"enabled": os.environ.get("TELEFUSER_FUSION", "1") != "0"}


def set_fusion(enabled: bool) -> None:
    _state["enabled"] = bool(enabled)


def fusion_enabled() -> bool:
    return _state["enabled"]


def cuda_fused(fn: Callable) -> Callable:
    """`fn` on CPU or with fusion off; `torch.compile(fn)` when its first argument is a CUDA tensor."""
    compiled: list[Callable] = []

    @functools.wraps(fn)
    def run(*args, **kwargs):
        # Under a TorchDispatchMode (FlopCounterMode, ...) a compiled call finds no frame to run and can leave the
        # function disabled for later calls (seen on the H200): run the reference there.
        if _state["enabled"] and args[0].is_cuda and not is_in_torch_dispatch_mode():
            if not compiled:
                compiled.append(torch.compile(fn, dynamic=None, fullgraph=True))
            return compiled[0](*args, **kwargs)
        return fn(*args, **kwargs)

    run.reference = fn
    return run
