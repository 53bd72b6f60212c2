"""Parallel configuration -> process groups: ``rank = ulysses_index * tp_degree + tp_index`` (TP innermost).

Neighbouring ranks, which share a host's fastest links, form the TP groups. Every rank validates the configuration
and the ranks agree on it before any group is made, so a bad one fails with the same error everywhere.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .agreement import describe_disagreement, gather_from_ranks


class ParallelConfigError(ValueError):
    """A parallel configuration that cannot run on this world; raised identically on every rank."""


@dataclass(frozen=True)
class ParallelConfig:
    """How one model replica is split: `ulysses_degree` sequence shards x `tp_degree` tensor shards."""

    ulysses_degree: int = 1
    tp_degree: int = 1

    def __post_init__(self) -> None:
        for name in ("ulysses_degree", "tp_degree"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ParallelConfigError(f"{name} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.ulysses_degree * self.tp_degree

    def check_world_size(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ParallelConfigError(
                f"world size {world_size} does not match ulysses_degree x tp_degree = "
                f"{self.ulysses_degree} x {self.tp_degree} = {self.world_size}"
            )

    def check_heads(self, num_heads: int) -> None:
        """Heads must split over TP first, then the TP shard's heads over Ulysses."""
        if num_heads % self.tp_degree:
            raise ParallelConfigError(f"{num_heads} attention heads cannot be split over tp_degree {self.tp_degree}")
        per_tp = num_heads // self.tp_degree
        if per_tp % self.ulysses_degree:
            raise ParallelConfigError(
                f"{num_heads} attention heads give {per_tp} heads per TP rank, which ulysses_degree "
                f"{self.ulysses_degree} does not divide"
            )

    def coordinates(self, rank: int) -> tuple[int, int]:
        """(ulysses_index, tp_index) of a global rank."""
        return divmod(rank, self.tp_degree)

    def group_ranks(self) -> tuple[list[list[int]], list[list[int]]]:
        """(ulysses groups, tp groups) as lists of global ranks; a pure function of the configuration."""
        u, t = self.ulysses_degree, self.tp_degree
        ulysses = [[i * t + j for i in range(u)] for j in range(t)]
        tp = [[i * t + j for j in range(t)] for i in range(u)]
        return ulysses, tp


@dataclass
class ParallelMesh:
    """This rank's view of the mesh: its groups and its coordinates in them."""

    config: ParallelConfig
    device_mesh: DeviceMesh
    rank: int
    world_size: int
    device: torch.device

    @property
    def ulysses_group(self) -> dist.ProcessGroup:
        return self.device_mesh.get_group("ulysses")

    @property
    def tp_group(self) -> dist.ProcessGroup:
        return self.device_mesh.get_group("tp")

    @property
    def ulysses_rank(self) -> int:
        return self.config.coordinates(self.rank)[0]

    @property
    def tp_rank(self) -> int:
        return self.config.coordinates(self.rank)[1]


def default_backend() -> str:
    """NCCL for CUDA tensors with gloo beside it for CPU-side control; gloo alone without CUDA, or when this host's
    ranks outnumber its GPUs (NCCL refuses two ranks on one GPU; gloo plus the CUDA-IPC copy engine works there)."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if torch.cuda.is_available() and dist.is_nccl_available() and torch.cuda.device_count() >= local_ranks:
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init_distributed(config: ParallelConfig, *, backend: str | None = None, timeout_s: float = 600.0) -> ParallelMesh:
    """Initialize torch.distributed from torchrun's environment (``env://``) and build the mesh.

    The world size is checked before the process group starts, so a wrong `--nproc-per-node` fails fast everywhere.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config.check_world_size(world_size)
    backend = backend or default_backend()
    if "nccl" in backend:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if world_size == 1 and "MASTER_ADDR" not in os.environ:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.setdefault("RANK", "0")
        dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    return build_mesh(config)


def build_mesh(config: ParallelConfig) -> ParallelMesh:
    """Build the ("ulysses", "tp") groups on an initialized default process group. Collective over all ranks."""
    if not dist.is_initialized():
        raise RuntimeError("build_mesh needs torch.distributed to be initialized first")
    world_size = dist.get_world_size()
    config.check_world_size(world_size)
    disagreement = describe_disagreement("the parallel configuration", gather_from_ranks(asdict(config), None))
    if disagreement:
        raise ParallelConfigError(disagreement)
    backend = str(dist.get_backend())
    device_type = "cuda" if "nccl" in backend else "cpu"
    device_mesh = init_device_mesh(
        device_type, (config.ulysses_degree, config.tp_degree), mesh_dim_names=("ulysses", "tp")
    )
    if device_type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return ParallelMesh(config, device_mesh, dist.get_rank(), world_size, device)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
