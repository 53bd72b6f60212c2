"""Ends the process when a GPU handshake stays incomplete: a CUDA stream stuck in a wait cannot be cancelled.

Its clock starts when the copy stream reaches the handshake, so a GPU backlog or a compile never counts as a dead
peer; it names the stalled epoch and what the peers posted, as NCCL's watchdog does.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from collections.abc import Callable

EXIT_CODE = 75


class HandshakeWatchdog:
    def __init__(
        self,
        rank: int,
        timeout_s: float,
        *,
        device=None,
        on_timeout: Callable[[str], None] | None = None,
        notices: Callable[[], str] | None = None,
        poll_s: float | None = None,
    ):
        self.rank = rank
        self.timeout_s = timeout_s
        self.device = device
        self.error: str | None = None
        self._on_timeout = on_timeout or _abort
        self._notices = notices or (lambda: "")
        self._poll_s = poll_s if poll_s is not None else min(0.05, max(0.002, timeout_s / 100))
        self._pending: collections.deque = collections.deque()  # [epoch, reached event, done event, clock start]
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"ulysses-watchdog-r{rank}", daemon=True)
        self._thread.start()

    def watch(self, epoch: int, reached, done) -> None:
        with self._lock:
            self._pending.append([epoch, reached, done, None])
        self._wake.set()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=1.0)

    def _run(self) -> None:
        try:
            if self.device is not None and getattr(self.device, "type", None) == "cuda":
                import torch

                torch.cuda.set_device(self.device)
            self._loop()
        except BaseException as exc:  # never die silently: the process would run on unwatched
            self.error = f"{type(exc).__name__}: {exc}"
            print(
                f"[telefuser] rank {self.rank}: the Ulysses handshake watchdog failed: {self.error}",
                file=sys.stderr,
                flush=True,
            )

    def _loop(self) -> None:
        while not self._stop:
            with self._lock:
                head = self._pending[0] if self._pending else None
            if head is None:
                self._wake.wait()
                self._wake.clear()
                continue
            epoch, reached, done, started = head
            if done.query():  # queried outside the lock
                with self._lock:
                    self._pending.popleft()
                continue
            now = time.monotonic()
            if started is None and reached.query():
                head[3] = started = now
            if started is not None and now - started > self.timeout_s:
                self._on_timeout(
                    f"[telefuser] rank {self.rank}: Ulysses copy-engine handshake epoch {epoch} did not complete "
                    f"within {self.timeout_s:g}s of the copy stream reaching it: a peer died, raised before submitting "
                    "its part of the group, or runs a different call sequence" + self._notices() + ". The copy "
                    "stream is blocked in a GPU wait that cannot be cancelled; ending the process."
                )
                return
            self._wake.wait(self._poll_s)
            self._wake.clear()


def _abort(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)
