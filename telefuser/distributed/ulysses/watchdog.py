"""A watchdog for GPU-side handshakes.

A stream-memory wait blocks the copy stream -- and every stream that waits on the group's completion event -- until
all peers publish the epoch. If a peer died or raised before submitting its part, that never happens and the process
would hang in its next synchronization. The watchdog thread watches each group's completion event; when one stays
incomplete past the timeout it prints which epoch stalled and ends the process with an error, as NCCL's watchdog does:
a CUDA stream stuck in a wait cannot be cancelled, so the process cannot continue.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Callable

EXIT_CODE = 75


class HandshakeWatchdog:
    def __init__(self, rank: int, timeout_s: float, on_timeout: Callable[[str], None] | None = None, poll_s: float = 0.005):
        self.rank = rank
        self.timeout_s = timeout_s
        self._on_timeout = on_timeout or _abort
        self._poll_s = poll_s
        self._pending: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"ulysses-watchdog-r{rank}", daemon=True)
        self._thread.start()

    def watch(self, epoch: int, event) -> None:
        with self._lock:
            self._pending.append((epoch, event, time.monotonic() + self.timeout_s))
        self._wake.set()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                while self._pending and self._pending[0][1].query():
                    self._pending.popleft()
                head = self._pending[0] if self._pending else None
            if head is None:
                self._wake.wait()
                self._wake.clear()
                continue
            epoch, _, deadline = head
            if time.monotonic() > deadline:
                self._on_timeout(
                    f"[telefuser] rank {self.rank}: Ulysses copy-engine handshake epoch {epoch} did not complete "
                    f"within {self.timeout_s:g}s: a peer died or raised before submitting its part of the group. "
                    "The copy stream is blocked in a GPU wait that cannot be cancelled; ending the process."
                )
                return
            time.sleep(self._poll_s)


def _abort(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)
