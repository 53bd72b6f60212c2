"""Which scatter transports a group can use, decided identically on every rank from local reports.

Nothing that can fail is asked after the exchange, so no rank picks a protocol its peers did not. GPUs are compared
by UUID: with per-rank CUDA_VISIBLE_DEVICES every rank's GPU is "device 0".
"""

from __future__ import annotations

import importlib
import socket
from typing import Any

import torch

TRANSPORTS = ("auto", "portable", "ce-symm", "ce-ipc", "host-shm")
# Preference order for "auto" on CUDA: PyTorch-owned mappings first, the legacy IPC mapping second.
CUDA_PREFERENCE = ("ce-symm", "ce-ipc")
CE_OPS = ("copy_2d", "copy_2d_batch", "stream_handshake", "stream_memop_support", "event_create", "event_destroy")
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
        return None, f"tf-kernel does not export {missing}; rebuild it with `make build-sm90`"
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


def gpu_uuid(index: int) -> str:
    """A GPU's identity across processes: its UUID, else its PCI location, never the process-local index."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None and str(uuid):
        return str(uuid)
    pci = tuple(getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if None not in pci:
        return "pci-{:04x}:{:02x}:{:02x}".format(*pci)
    raise RuntimeError("torch reports neither a UUID nor a PCI location for the GPU")


def _cuda_report(index: int, ops, flag_bits: int) -> tuple[dict, str | None]:
    """(this GPU's identity and peer-access answers, why the copy engine cannot run here or None)."""
    info: dict = {"gpu": None, "peers": {}}
    try:
        info["gpu"] = gpu_uuid(index)
        for other in range(torch.cuda.device_count()):
            if other != index:
                info["peers"][gpu_uuid(other)] = bool(torch.cuda.can_device_access_peer(index, other))
    except Exception as exc:  # reported, never raised: the exchange must happen on every rank
        return info, f"cannot identify GPU {index} or its peers ({type(exc).__name__}: {exc})"
    if ops is None:
        return info, None
    try:
        memops32, memops64 = (bool(v) for v in ops.stream_memop_support(index))
    except Exception as exc:
        return info, f"cannot query stream memory operations on GPU {index} ({type(exc).__name__}: {exc})"
    if not memops32:
        return info, f"GPU {info['gpu']} does not support stream memory operations"
    if flag_bits == 64 and not memops64:
        return info, f"GPU {info['gpu']} does not support 64-bit stream memory operations (use flag_bits=32)"
    return info, None


def local_report(device: torch.device, flag_bits: int = 64) -> dict:
    """What this rank can do; pure local checks, no collective, never raises."""
    reasons: dict[str, str | None] = {}
    info: dict = {"gpu": None, "peers": {}}
    if device.type == "cuda":
        ops, missing = tf_kernel_ops(CE_OPS + IPC_OPS)
        index = device.index if device.index is not None else torch.cuda.current_device()
        info, problem = _cuda_report(index, ops, flag_bits)
        reasons["ce-ipc"] = missing or problem
        if missing is None and not _torch_at_least(2, 11):
            reasons["ce-symm"] = f"torch {torch.__version__} < 2.11 (Symmetric Memory mappings)"
        else:
            try:
                importlib.import_module("torch.distributed._symmetric_memory")  # the probe: does this build have it?

                reasons["ce-symm"] = missing or problem
            except ImportError as exc:
                reasons["ce-symm"] = f"torch Symmetric Memory is unavailable ({exc})"
    else:
        reasons["ce-symm"] = reasons["ce-ipc"] = f"the input is on {device.type}, not CUDA"
    reasons["host-shm"] = None if device.type == "cpu" else f"the input is on {device.type}, not CPU"
    return {"host": socket.gethostname(), **info, "reasons": reasons}


def _peer_problem(reports: list[dict], name: str) -> str | None:
    """Whether every rank can write into every other rank's GPU, from the answers each rank gave about itself."""
    gpus = [r["gpu"] for r in reports]
    if name == "ce-symm" and len(set(gpus)) < len(gpus):
        shared = sorted({g for g in gpus if gpus.count(g) > 1})
        return f"ranks share a GPU ({', '.join(shared)}); Symmetric Memory needs one GPU per rank"
    for r, report in enumerate(reports):
        for p, gpu in enumerate(gpus):
            if gpu == report["gpu"]:
                continue  # the same GPU (processes sharing it): CUDA IPC works there
            access = report["peers"].get(gpu)
            if access is False:
                return f"rank {r}'s GPU {report['gpu']} has no peer access to rank {p}'s GPU {gpu}"
            if access is None and name == "ce-ipc":
                return (
                    f"rank {r} cannot see rank {p}'s GPU {gpu} (CUDA_VISIBLE_DEVICES differs between ranks); legacy "
                    "CUDA IPC needs every peer's GPU visible"
                )
    return None


def agreed_candidates(
    requested: str, device: torch.device, channel, flag_bits: int = 64
) -> tuple[list[str], dict[str, str]]:
    """(transports to try in order, why each other one is out), identical on every rank. One bounded exchange."""
    if requested not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {requested!r}")
    reports = channel.gather(local_report(device, flag_bits), "transport selection")
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
            why = _peer_problem(reports, name)
        if why is not None:
            excluded[name] = why
    return [n for n in wanted if n not in excluded], excluded
