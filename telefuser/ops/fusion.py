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

from .compile_stats import note_compiled_call

_state = {"enabled": os.environ.get("TELEFUSER_FUSION", "1") != "0"}


def set_fusion(enabled: bool) -> None:
    _state["enabled"] = bool(enabled)


def fusion_enabled() -> bool:
    return _state["enabled"]


def compiles_here(x: torch.Tensor) -> bool:
    """Whether a call whose data is `x` runs compiled code: fusion on, a CUDA tensor, and neither already inside a
    compiled region being traced (the chain is then traced into the region) nor under a TorchDispatchMode
    (FlopCounterMode, ...), where a compiled call finds no frame to run and can leave the function disabled for later
    calls (seen on the H200)."""
    return not torch.compiler.is_compiling() and _state["enabled"] and x.is_cuda and not is_in_torch_dispatch_mode()


def cuda_fused(fn: Callable) -> Callable:
    """`fn` on CPU or with fusion off; `torch.compile(fn)` when its first argument is a CUDA tensor. Inside a
    compiled region (`ops.regions`) `fn` is traced into the region instead."""
    compiled: list[Callable] = []

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if compiles_here(args[0]):
            if not compiled:
                compiled.append(torch.compile(fn, dynamic=None, fullgraph=True))
            note_compiled_call()
            return compiled[0](*args, **kwargs)
        return fn(*args, **kwargs)

    run.reference = fn
    return run
