"""The stream service under torchrun: rank 0's sessions are made, advanced and closed on every rank.

`FollowingFactory` is rank 0's `SessionFactory`; `follow(factory, group)` is a follower rank's loop. Both are the
stream contract over common/replay.py: a session is the object "session" made with (image, prompt, config), and
`next_chunk(keys)` and `close()` are its replayed calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..common.replay import Follower, Leader, Replayed
from .contract import Chunk, SessionFactory


class FollowingFactory:
    """Rank 0's factory: every session call runs on the followers first, then here."""

    def __init__(self, factory: SessionFactory, group, *, heartbeat_s: float = 60.0):
        self._factory = factory
        self._leader = Leader(group, heartbeat_s=heartbeat_s)
        if callable(getattr(factory, "memory_estimate", None)):  # local arithmetic on rank 0: nothing is broadcast
            self.memory_estimate = factory.memory_estimate

    @property
    def metadata(self) -> dict[str, Any]:
        return self._factory.metadata

    @property
    def pings(self) -> int:
        return self._leader.pings

    def validate(self, image: np.ndarray, prompt: str, config: dict[str, Any]) -> None:
        self._factory.validate(image, prompt, config)

    def create(self, image: np.ndarray, prompt: str, config: dict[str, Any]) -> FollowedSession:
        self._factory.validate(image, prompt, config)  # raises here, before any follower hears of it
        made = self._leader.make(
            "session", image, prompt, config, local=lambda: self._factory.create(image, prompt, config)
        )
        return FollowedSession(made)

    def shutdown(self) -> None:
        """Tell the followers to exit; idempotent. Call after the last session is closed."""
        self._leader.shutdown()


class FollowedSession:
    def __init__(self, made: Replayed):
        self._made = made

    @property
    def total_chunks(self) -> int | None:
        return self._made.local.total_chunks

    def __getattr__(self, name: str) -> Any:  # optional attributes (total_frames, fps...) of the session
        return getattr(self._made.local, name)

    def next_chunk(self, keys: list[str]) -> Chunk:
        return self._made.call("next_chunk", list(keys))

    def close(self) -> None:
        self._made.close()


def follow(factory: SessionFactory, group) -> int:
    """A follower rank: run rank 0's session calls on `factory` until it stops; returns the number of calls."""
    return Follower(group).follow({"session": factory.create})
