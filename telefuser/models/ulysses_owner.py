"""`UlyssesOwner`: the mixin of a model that owns one `UlyssesCommunicator`, shared by all its blocks."""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist

from ..distributed.mesh import ParallelMesh
from ..distributed.ulysses import UlyssesCommunicator


class UlyssesOwner:
    """The model's ``__init__`` sets `communicator` and `ulysses_group` to None; its spec's parallel plan does its own
    checks, then calls `open_ulysses`. `_ulysses_coordinates()` is (rank, world size) in the group, (0, 1) dense."""

    communicator: UlyssesCommunicator | None
    ulysses_group: dist.ProcessGroup | None

    def open_ulysses(
        self, mesh: ParallelMesh, communicator_factory: Callable[[dist.ProcessGroup], UlyssesCommunicator] | None = None
    ) -> None:
        """Close the current communicator, then open one over `mesh.ulysses_group` when its degree is above 1 (a
        `UlyssesCommunicator` choosing its own transport unless `communicator_factory` makes another)."""
        self.close()
        if mesh.config.ulysses_degree > 1:
            self.ulysses_group = mesh.ulysses_group
            self.communicator = (communicator_factory or UlyssesCommunicator)(mesh.ulysses_group)

    def close(self) -> None:
        """Release the Ulysses communicator (local, no collective); the model then runs without sequence split."""
        if self.communicator is not None:
            self.communicator.close()
        self.communicator, self.ulysses_group = None, None

    def reset_parallel(self) -> bool:
        """At a request boundary, on every rank: reopen the copy-engine transport after a failure or fallback on any
        rank (`UlyssesCommunicator.reset`); one small exchange when all are healthy, nothing when the model runs
        dense. Returns whether anything was reset."""
        return self.communicator.reset() if self.communicator is not None else False

    def _ulysses_coordinates(self) -> tuple[int, int]:
        if self.communicator is None:
            return 0, 1
        return self.communicator.rank, self.communicator.world_size
