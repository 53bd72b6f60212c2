"""Memory-bound elementwise chains compiled into single kernels on CUDA.

Between the matmuls and the attention of a DiT block sit chains of cheap elementwise ops: norms, AdaLN modulation,
gated residuals, RoPE. Eager PyTorch runs each op as its own kernel that reads and writes the whole activation, and at
tens of thousands of rows those passes add up (measured on the H200: several percent of a MiniMax H3 call).
`cuda_fused(fn)` keeps `fn` as the eager reference (CPU, tests) and, for CUDA inputs, runs it through torch.compile
so that Inductor emits one Triton kernel per chain. The arithmetic is the same; only the rounding of intermediate
values in the input dtype may differ.

``TELEFUSER_FUSION=0`` (or `set_fusion(False)`) runs the eager reference everywhere; benchmarks toggle it to time
both in one process. The first call per new shape compiles (seconds); later calls reuse the kernel.
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
