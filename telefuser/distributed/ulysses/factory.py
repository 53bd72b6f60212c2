"""Build a copy-engine backend by transport name. Collective: every rank of the group calls it together."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .copy_engine import CopyEngineBackend, CopyEngineOptions
from .peer_mapping import CopyEngineSetupError
from .primitives import CudaPrimitives, HostPrimitives
from .selection import CE_OPS, IPC_OPS, tf_kernel_ops
from .watchdog import HandshakeWatchdog


def create_copy_engine(
    transport: str, group: dist.ProcessGroup, device: torch.device, options: CopyEngineOptions, mapping_factory=None
) -> CopyEngineBackend:
    """`mapping_factory(group, device)` replaces the transport's mapping (tests inject failures through it)."""
    if transport == "host-shm":
        from .mapping_host import HostSharedMemoryMapping

        mapping = (mapping_factory or (lambda g, d: HostSharedMemoryMapping(g)))(group, device)
        return CopyEngineBackend(transport, group, mapping, HostPrimitives(options.timeout_s), options)
    ops, missing = tf_kernel_ops(CE_OPS + (IPC_OPS if transport == "ce-ipc" else ()))
    if ops is None:  # agreed earlier by selection; reaching this means the ranks' environments changed
        raise CopyEngineSetupError(missing)
    if mapping_factory is not None:
        mapping = mapping_factory(group, device)
    elif transport == "ce-ipc":
        from .mapping_ipc import CudaIpcMapping

        mapping = CudaIpcMapping(group, ops, device)
    elif transport == "ce-symm":
        from .mapping_symm import SymmetricMemoryMapping

        mapping = SymmetricMemoryMapping(group, device)
    else:
        raise ValueError(f"unknown copy-engine transport {transport!r}")
    watchdog = HandshakeWatchdog(dist.get_rank(group), options.timeout_s)
    try:
        return CopyEngineBackend(transport, group, mapping, CudaPrimitives(ops), options, watchdog)
    except BaseException:
        watchdog.close()
        raise
