"""A watchdog for GPU-side handshakes.

A stream-memory wait blocks the copy stream -- and every stream that waits on the group's completion event -- until
all peers publish the epoch. If a peer died, raised before submitting its part, or runs a different call sequence,
that never happens and the process would hang in its next synchronization. The watchdog thread watches each group:
its clock starts when the copy stream *reaches* the handshake (an event recorded just before the waits), so a GPU
backlog ahead of the handshake or a slow compile on this rank never counts; when the group's completion event stays
incomplete for `timeout_s` after that, it prints which epoch stalled (and what the peers posted about their own
failures) and ends the process, as NCCL's watchdog does: a CUDA stream stuck in a wait cannot be cancelled, so the
process cannot continue.

The thread sets its device before it touches an event (otherwise it would create a context on GPU 0), never holds
its lock while it queries the GPU (the submitting thread takes that lock for every group), polls at a coarse interval,
and reports its own failures: a failing query is printed and kept in `error`, which the backend raises at its next
call instead of running on unwatched.
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
