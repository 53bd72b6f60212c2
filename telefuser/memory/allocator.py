"""The CUDA caching allocator's settings, chosen by the engine before CUDA starts.

Expandable segments let the allocator grow one mapping instead of carving fixed segments, so memory freed by one
stage (the text encoder, a VAE's convolution workspaces) serves the next stage's differently sized tensors; without
them an 80 GB card ran out of memory with gigabytes reserved but free (docs/perf/2026-12-06). A user's own
``PYTORCH_CUDA_ALLOC_CONF`` is left as it is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
ENGINE_ALLOC_CONF = "expandable_segments:True"


def configure_cuda_allocator() -> str:
    """Set the engine's allocator settings unless the user set their own; returns the settings in force. Before
    CUDA initializes this is the environment variable; after, the allocator is told directly (new segments follow
    it)."""
    own = os.environ.get(ALLOC_CONF)
    if own is not None:
        return own
    import torch

    os.environ[ALLOC_CONF] = ENGINE_ALLOC_CONF
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        set_allocator_settings(ENGINE_ALLOC_CONF)
        log.debug("CUDA was initialized before the engine set %s; told the allocator directly", ALLOC_CONF)
    return ENGINE_ALLOC_CONF


@contextmanager
def ipc_shareable_segments() -> Iterator[None]:
    """Allocations inside come from plain cudaMalloc segments, which legacy CUDA IPC handles can export: with
    expandable segments on, new memory comes from cuMemCreate, which ``cudaIpcGetMemHandle`` refuses. The allocator
    then takes no block of an expandable segment either; the setting in force comes back on exit."""
    if not _expandable_on():
        yield
        return
    set_allocator_settings("expandable_segments:False")
    try:
        yield
    finally:
        set_allocator_settings("expandable_segments:True")


def _expandable_on() -> bool:
    settings = os.environ.get(ALLOC_CONF, "").replace(" ", "").split(",")
    return "expandable_segments:True" in settings


def set_allocator_settings(settings: str) -> None:
    """Tell the running allocator `settings` (new segments follow them), through the accelerator-generic call where
    this torch has it (torch 2.11 deprecates the CUDA one with a warning on every call)."""
    import torch

    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter(settings)
