"""Builds a copy-engine backend by transport name; collective, and every step that can fail is agreed first.

So a failure anywhere (tf-kernel import, mapping, allocations, stream, watchdog, probe) raises the same
`CopyEngineSetupError` on every rank and the communicator falls back together.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .copy_engine import CopyEngineBackend, CopyEngineOptions
from .peer_mapping import agreed_step
from .primitives import CudaPrimitives, HostPrimitives
from .selection import CE_OPS, IPC_OPS, tf_kernel_ops
from .watchdog import HandshakeWatchdog


def _required_ops(transport: str):
    ops, missing = tf_kernel_ops(CE_OPS + (IPC_OPS if transport == "ce-ipc" else ()))
    if ops is None:  # agreed earlier by selection; reaching this means the ranks' environments changed
        raise RuntimeError(missing)
    return ops


def _cuda_mapping(transport: str, channel, group, ops, device):
    if transport == "ce-ipc":
        from .mapping_ipc import CudaIpcMapping

        return CudaIpcMapping(channel, ops, device)
    if transport == "ce-symm":
        from .mapping_symm import SymmetricMemoryMapping

        return SymmetricMemoryMapping(channel, group, device)
    raise ValueError(f"unknown copy-engine transport {transport!r}")


def create_copy_engine(
    transport: str,
    channel,
    group: dist.ProcessGroup,
    device: torch.device,
    options: CopyEngineOptions,
    mapping_factory=None,
) -> CopyEngineBackend:
    """`mapping_factory(channel, device)` replaces the transport's mapping (tests inject failures through it)."""
    if transport == "host-shm":
        from .mapping_host import HostSharedMemoryMapping

        make_mapping = mapping_factory or (lambda ch, d: HostSharedMemoryMapping(ch))
        mapping = agreed_step(channel, "host-shm mapping", lambda: make_mapping(channel, device))
        prims = HostPrimitives(options.timeout_s, channel.notices_text)
        return CopyEngineBackend(transport, channel, mapping, prims, options)
    ops = agreed_step(channel, f"{transport}: tf-kernel operators", lambda: _required_ops(transport))
    make_mapping = mapping_factory or (lambda ch, d: _cuda_mapping(transport, ch, group, ops, d))
    mapping = agreed_step(channel, f"{transport} mapping", lambda: make_mapping(channel, device))

    def local_parts():
        watchdog = HandshakeWatchdog(channel.rank, options.timeout_s, notices=channel.notices_text)
        try:
            return CudaPrimitives(ops, device), watchdog
        except BaseException:
            watchdog.close()
            raise

    prims, watchdog = agreed_step(
        channel, f"{transport}: events and watchdog", local_parts, lambda parts: (parts[1].close(), parts[0].close())
    )
    try:
        return CopyEngineBackend(transport, channel, mapping, prims, options, watchdog)
    except BaseException:
        watchdog.close()
        prims.close()
        raise
