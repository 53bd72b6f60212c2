"""One launch context for every entry point (examples, services, benches): parallel layout, device, dtype, rank.

    add_runtime_args(parser)                  # --ulysses-degree [--tp-degree] --device --dtype
    runtime = Runtime.from_args(args)         # torchrun's world -> mesh (or none on one rank), device, dtype
    model = runtime.parallelize(model, spec)  # once: the model spec's plan, TP then Ulysses
    ...
    runtime.close()                           # ends the process group

A layout that needs more ranks than were launched is refused before any process group starts, with the torchrun
command to use; a world that does not match is refused with the same error on every rank (`init_distributed`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .arg_types import positive_int
from .dtypes import DTYPE_NAMES, torch_dtype

if TYPE_CHECKING:  # torch is imported where it is used: the services' CLIs parse their flags without it
    import torch

    from .distributed.mesh import ParallelConfig, ParallelMesh


def add_runtime_args(parser: argparse.ArgumentParser, *, tp: bool = False, ulysses_default: int | None = 1) -> None:
    """The launch flags. `tp`: the model takes tensor parallelism too. `ulysses_default` None: every launched rank
    is a Ulysses rank (the world size over the TP degree)."""
    group = parser.add_argument_group("launch")
    group.add_argument(
        "--ulysses-degree",
        "--gpu-num",
        dest="ulysses_degree",
        type=positive_int,
        default=ulysses_default,
        help="Ulysses sequence-parallel degree (launch with torchrun --nproc-per-node=N)"
        + ("" if ulysses_default else "; default: every launched rank"),
    )
    if tp:
        group.add_argument("--tp-degree", type=positive_int, default=1, help="tensor-parallel degree (innermost)")
    group.add_argument("--device", default=None, help="default: this rank's CUDA device, else cpu")
    group.add_argument(
        "--dtype", choices=DTYPE_NAMES, default=None, help="model dtype; default bfloat16 on CUDA, float32 on CPU"
    )


def _rank_device(device: str | torch.device | None) -> torch.device:
    """This rank's device: the one asked for, else its own GPU (GPU 0 when the host's ranks outnumber its GPUs and
    share one), else the CPU."""
    import torch

    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and device.index is None:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local if local < torch.cuda.device_count() else 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _default_dtype(device: torch.device) -> torch.dtype:
    import torch

    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass(frozen=True)
class Runtime:
    mesh: ParallelMesh | None  # None: one rank, nothing split
    device: torch.device
    dtype: torch.dtype

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Runtime:
        """The flags of `add_runtime_args`; a flag the namespace lacks takes its default (every rank Ulysses)."""
        return cls.launch(
            ulysses_degree=getattr(args, "ulysses_degree", None),
            tp_degree=getattr(args, "tp_degree", 1),
            device=getattr(args, "device", None),
            dtype=getattr(args, "dtype", None),
        )

    @classmethod
    def launch(
        cls,
        *,
        ulysses_degree: int | None = 1,
        tp_degree: int = 1,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
    ) -> Runtime:
        from .memory.allocator import configure_cuda_allocator

        configure_cuda_allocator()  # before anything touches CUDA
        from .distributed.mesh import ParallelConfig, init_distributed

        world = int(os.environ.get("WORLD_SIZE", "1"))
        if ulysses_degree is None:
            ulysses_degree = max(1, world // max(1, tp_degree))
        parallel = ParallelConfig(ulysses_degree=ulysses_degree, tp_degree=tp_degree)
        if world == 1 and parallel.world_size > 1:
            raise SystemExit(
                f"ulysses x tp = {parallel.world_size} ranks: launch with torchrun "
                f"--nproc-per-node={parallel.world_size}"
            )
        mesh = init_distributed(parallel) if world > 1 else None
        device = _rank_device(device)
        if dtype is None:
            dtype = _default_dtype(device)
        elif isinstance(dtype, str):
            dtype = torch_dtype(dtype)
        return cls(mesh, device, dtype)

    @classmethod
    def one_rank(cls, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> Runtime:
        """One rank, nothing split, on `device`: what a pipeline builder runs on when no launch made a runtime
        (tests, tools, library calls). Starts no process group and selects no CUDA device. `dtype` None: bfloat16 on
        CUDA, float32 on the CPU, as `launch`."""
        import torch

        device = torch.device(device)
        return cls(None, device, _default_dtype(device) if dtype is None else dtype)

    @property
    def rank(self) -> int:
        return self.mesh.rank if self.mesh is not None else 0

    @property
    def world_size(self) -> int:
        return self.mesh.world_size if self.mesh is not None else 1

    @property
    def parallel(self) -> ParallelConfig:
        from .distributed.mesh import ParallelConfig

        return self.mesh.config if self.mesh is not None else ParallelConfig()

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def parallelize(self, model, spec, *, communicator_factory=None):
        """Apply this launch's layout to `model`, once: the plan of `spec` (the model's `ModelSpec`, which the
        caller holds: TP, then Ulysses). Nothing on one rank. Returns the model.

        Called on an empty (meta) model before its checkpoint is read, each TP rank then reads only its slices; on
        a dense model with weights, the plan slices them. `communicator_factory` (group -> communicator) picks the
        Ulysses transport for benches and validation; the default is the communicator's own choice."""
        if self.mesh is None or self.mesh.world_size == 1:
            return model
        return spec.parallelize(model, self.mesh, communicator_factory=communicator_factory)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
