"""One compiled region per transformer block: PyTorch's regional compilation, shared by every block of a model.

`compiled_region(forward)` wraps a block's forward, called as ``region(block, x, ...)``. On CUDA with fusion on
(`ops.fusion`, ``TELEFUSER_FUSION=0`` turns it off) it runs ``torch.compile(forward, fullgraph=True)``: one compiled
function for all blocks, since dynamo treats a block's parameters as inputs (its inlined nn.Module handling), so 40
identical blocks share one graph and the host pays one guard check and one wrapper per block instead of one per
elementwise chain. Elsewhere it runs the forward as it is (the reference), whose `cuda_fused` chains then run eagerly
on the CPU as before.

What a region must not trace runs as opaque `torch.library` custom ops inside it (the Ulysses exchange, attention
kernels, a KV-window write); per-layer state reaches the region as tensors, never as a layer index, and anything that
changes per chunk (ring slots, window length) as tensor data, so the regions compile once per shape (this folder's
README). Tests may compile on the CPU on purpose with `compile_regions_on`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .compile_stats import note_compiled_call
from .fusion import fusion_enabled

_state = {"devices": ("cuda",), "backend": "inductor"}
# One region function serves every block of every model in the process, so each (model variant, read or commit,
# dtype) is one cache entry of it: dynamo's default of 8 entries per function is too few for a bench or a test run
# that builds several models, and past it a fullgraph region raises instead of running.
REGION_RECOMPILE_LIMIT = 64


@contextlib.contextmanager
def compile_regions_on(*devices: str, backend: str = "inductor") -> Iterator[None]:
    """Compile regions whose data lives on `devices` (default: CUDA only) with `backend`, inside the block; for tests
    that compile on the CPU on purpose (``backend="aot_eager"`` checks the tracing and the custom ops without
    generating code)."""
    before = dict(_state)
    _state.update(devices=tuple(devices), backend=backend)
    try:
        yield
    finally:
        _state.update(before)


def region_compiles(x: torch.Tensor) -> bool:
    """Whether a region whose data is `x` runs compiled (else its forward runs as it is)."""
    return (
        not torch.compiler.is_compiling()
        and fusion_enabled()
        and x.device.type in _state["devices"]
        and not is_in_torch_dispatch_mode()  # a compiled call under FlopCounterMode & co. has no frame to run
    )


def compiled_region(forward: Callable) -> Callable:
    """``region(module, x, *args, **kwargs)``: `forward` compiled (one graph per shape for every module of its type)
    when `x` lives on a device regions compile on and fusion is on; `forward` itself otherwise."""
    compiled: dict[str, Callable] = {}

    @functools.wraps(forward)
    def region(module, x: torch.Tensor, *args, **kwargs):
        if not region_compiles(x):
            return forward(module, x, *args, **kwargs)
        backend = _state["backend"]
        fn = compiled.get(backend)
        if fn is None:
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, REGION_RECOMPILE_LIMIT)
            fn = compiled[backend] = torch.compile(forward, fullgraph=True, dynamic=None, backend=backend)
        note_compiled_call()
        return fn(module, x, *args, **kwargs)

    region.reference = forward
    return region
