"""Which scatter transport a group can use, decided identically on every rank.

Each rank reports what it can do locally (host name, device, and for every copy-engine transport either None or why
not). Every rank then computes the same ordered list of transports that all ranks support, so no rank ever picks a
protocol its peers did not.
"""

from __future__ import annotations

import importlib
import socket
from typing import Any

import torch
import torch.distributed as dist

from ..agreement import gather_from_ranks

TRANSPORTS = ("auto", "portable", "ce-symm", "ce-ipc", "host-shm")
# Preference order for "auto" on CUDA: PyTorch-owned mappings first, the legacy IPC mapping second.
CUDA_PREFERENCE = ("ce-symm", "ce-ipc")
CE_OPS = ("copy_2d", "stream_handshake")
IPC_OPS = ("ipc_get_handle", "ipc_open_handle", "ipc_close_handle")


def tf_kernel_ops(required: tuple[str, ...]) -> tuple[Any | None, str | None]:
    """torch.ops.tf_kernel if it exports `required`, else (None, why not)."""
    try:
        importlib.import_module("tf_kernel")
    except ImportError as exc:
        return None, f"tf-kernel is not importable ({exc}); build it with `make build-sm90`"
    ops = torch.ops.tf_kernel
    missing = [name for name in required if not _has_op(ops, name)]
    if missing:
        return None, f"tf-kernel does not export {missing}"
    return ops, None


def _has_op(namespace, name: str) -> bool:
    try:
        getattr(namespace, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _torch_at_least(major: int, minor: int) -> bool:
    parts = torch.__version__.split("+")[0].split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


def local_report(device: torch.device) -> dict:
    """What this rank can do; pure local checks, no collective."""
    reasons: dict[str, str | None] = {}
    if device.type == "cuda":
        _, missing = tf_kernel_ops(CE_OPS + IPC_OPS)
        reasons["ce-ipc"] = missing
        if missing is None and not _torch_at_least(2, 11):
            reasons["ce-symm"] = f"torch {torch.__version__} < 2.11 (Symmetric Memory mappings)"
        else:
            try:
                import torch.distributed._symmetric_memory as symm_mem  # noqa: F401

                reasons["ce-symm"] = missing
            except ImportError as exc:
                reasons["ce-symm"] = f"torch Symmetric Memory is unavailable ({exc})"
    else:
        reasons["ce-symm"] = reasons["ce-ipc"] = f"the input is on {device.type}, not CUDA"
    reasons["host-shm"] = None if device.type == "cpu" else f"the input is on {device.type}, not CPU"
    index = device.index if device.type == "cuda" else None
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return {"host": socket.gethostname(), "device": index, "reasons": reasons}


def _peer_access(reports: list[dict]) -> str | None:
    devices = sorted({r["device"] for r in reports})
    for a in devices:
        for b in devices:
            if a != b and not torch.cuda.can_device_access_peer(a, b):
                return f"GPU {a} has no peer access to GPU {b}"
    return None


def agreed_candidates(requested: str, device: torch.device, group: dist.ProcessGroup) -> tuple[list[str], dict[str, str]]:
    """(transports to try in order, why each other one is out), identical on every rank. Collective."""
    if requested not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {requested!r}")
    reports = gather_from_ranks(local_report(device), group)
    wanted = CUDA_PREFERENCE if requested == "auto" else (requested,)
    if requested == "portable":
        return [], {}
    excluded: dict[str, str] = {}
    hosts = {r["host"] for r in reports}
    for name in wanted:
        why = next((f"rank {i}: {r['reasons'][name]}" for i, r in enumerate(reports) if r["reasons"][name]), None)
        if why is None and len(hosts) > 1:
            why = f"ranks span several hosts {sorted(hosts)}"
        if why is None and name.startswith("ce-"):
            why = _peer_access(reports)
            devices = [r["device"] for r in reports]
            if why is None and name == "ce-symm" and len(set(devices)) < len(devices):
                why = "ranks share a GPU; Symmetric Memory needs one GPU per rank"
        if why is not None:
            excluded[name] = why
    return [n for n in wanted if n not in excluded], excluded
