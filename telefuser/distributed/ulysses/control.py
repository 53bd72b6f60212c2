"""Small exchanges among the ranks of one group, each bounded by a timeout: the communicator's control channel.

They go through the default process group's store, not collectives: a store wait has its own timeout and an
abandoned one leaves nothing behind, where an abandoned collective leaves the group out of step for good.
"""

from __future__ import annotations

import pickle
import threading
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..agreement import first_error
from .primitives import UlyssesTimeoutError


class UlyssesOutOfStepError(UlyssesTimeoutError):
    """Ranks met at an exchange describing different steps: they are running different call sequences."""


class _Sequence:
    """Exchange numbers for one set of ranks in this process."""

    def __init__(self) -> None:
        self.next = 0
        self.last_key: str | None = None  # this rank's key of the last completed exchange (deleted at the next one)
        self.resets = 0


_SEQUENCES: dict[tuple[int, ...], _Sequence] = {}
_LOCK = threading.Lock()


def _sequence_for(ranks: tuple[int, ...]) -> _Sequence:
    with _LOCK:
        return _SEQUENCES.setdefault(ranks, _Sequence())


class ControlChannel:
    """Bounded exchanges among the ranks of `group`. World size 1 needs no store and never waits."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float):
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.ranks = tuple(dist.get_process_group_ranks(group))
        self.timeout_s = timeout_s
        self._prefix = "telefuser-ulysses/" + ".".join(map(str, self.ranks))
        self._store = dist.distributed_c10d._get_default_store() if self.world_size > 1 else None
        self._seq = _sequence_for(self.ranks)

    # -- exchanges --------------------------------------------------------------------------------------------------
    def gather(self, value: Any, what: str) -> list[Any]:
        """Every rank's `value`, indexed by rank in the group. Raises UlyssesTimeoutError on every rank that waited
        longer than the timeout, UlyssesOutOfStepError where ranks met describing different steps."""
        if self.world_size == 1:
            return [value]
        with _LOCK:
            number = self._seq.next
            self._seq.next += 1
        base = f"{self._prefix}/x{number}/"
        values = self._meet(base, what, value, rollback=number)
        self._forget_previous(base + str(self.rank))
        return values

    def _meet(self, base: str, what: str, value: Any, rollback: int | None) -> list[Any]:
        own = base + str(self.rank)
        keys = [base + str(p) for p in range(self.world_size)]
        self._store.set(own, pickle.dumps((what, value)))
        try:
            self._store.wait(keys, timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:  # DistStoreError (TCPStore) and RuntimeError (FileStore) on timeout
            missing = [p for p, key in enumerate(keys) if not self._store.check([key])]
            self._store.delete_key(own)  # nobody may read this step later: it did not happen
            if rollback is not None:
                with _LOCK:
                    if self._seq.next == rollback + 1:
                        self._seq.next = rollback
            raise UlyssesTimeoutError(
                f"rank {self.rank}: ranks {missing} of the Ulysses group did not reach {what} within "
                f"{self.timeout_s:g}s: they are running a different call sequence (a repeated call signature skips "
                f"agreement; TELEFUSER_ULYSSES_VERIFY=always checks every call), raised, or died" + self.notices_text()
            ) from exc
        entries = [pickle.loads(raw) for raw in self._store.multi_get(keys)]
        steps = [step for step, _ in entries]
        if any(step != what for step in steps):
            listing = "; ".join(f"rank {p}: {step}" for p, step in enumerate(steps))
            raise UlyssesOutOfStepError(f"the Ulysses group's ranks are out of step at one exchange ({listing})")
        return [v for _, v in entries]

    def _forget_previous(self, own_key: str) -> None:
        """Every rank wrote this exchange, so every rank has read the previous one: its key can go."""
        previous, self._seq.last_key = self._seq.last_key, own_key
        if previous is not None:
            self._store.delete_key(previous)

    def barrier(self, what: str) -> None:
        self.gather(None, what)

    def agree(self, local_error: str | None, what: str) -> str | None:
        """One message for all ranks: None when no rank failed, else each failing rank's error."""
        return first_error(self.gather(local_error, what))

    # -- reset ------------------------------------------------------------------------------------------------------
    def resync(self, value: Any, what: str) -> list[Any]:
        """An exchange in the reset namespace, which also brings the exchange numbers of every rank back into step
        (after a rank timed out in an exchange its peers never made). Bounded like `gather`."""
        if self.world_size == 1:
            return [value]
        with _LOCK:
            number = self._seq.resets
            self._seq.resets += 1
            position = self._seq.next
        base = f"{self._prefix}/reset{number}/"
        try:
            entries = self._meet(base, what, (position, value), rollback=None)
        except UlyssesTimeoutError:
            with _LOCK:
                self._seq.resets = number
            raise
        with _LOCK:
            self._seq.next = max(p for p, _ in entries)
        self._forget_previous(base + str(self.rank))
        return [v for _, v in entries]

    # -- failure notices: why a rank left, for the messages of the peers it leaves waiting -----------------------------
    def post_failure(self, message: str) -> None:
        if self._store is not None:
            try:
                self._store.set(f"{self._prefix}/failure/{self.rank}", message[:2000])
            except RuntimeError:
                pass

    def clear_failure(self) -> None:
        if self._store is not None:
            try:
                self._store.delete_key(f"{self._prefix}/failure/{self.rank}")
            except RuntimeError:
                pass

    def failure_notices(self) -> dict[int, str]:
        """What peers posted before leaving; best effort, never waits."""
        notices: dict[int, str] = {}
        if self._store is None:
            return notices
        for p in range(self.world_size):
            key = f"{self._prefix}/failure/{p}"
            try:
                if p != self.rank and self._store.check([key]):
                    notices[p] = self._store.get(key).decode(errors="replace")
            except RuntimeError:
                pass
        return notices

    def notices_text(self) -> str:
        """What peers posted, as a suffix for a timeout message."""
        notices = self.failure_notices()
        return "".join(f"; rank {p} reported: {m}" for p, m in sorted(notices.items()))
