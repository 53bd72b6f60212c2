"""Ends the process when a GPU handshake phase stays incomplete: a CUDA stream stuck in a wait cannot be cancelled.

Every phase writes two words of pinned host memory from the copy stream (`marker`): its token when the stream
reaches it (with "passed" cleared), and its token again once every peer answered. The watchdog reads them without any
CUDA call, so it watches eager groups and CUDA graph replays alike (a replay rewrites the captured tokens) and never
disturbs a capture in progress. Its clock starts when the stream reaches a phase, so a GPU backlog or a compile never
counts as a dead peer; after `timeout_s` in one phase it names the phase and what the peers posted, as NCCL's
watchdog does, and ends the process.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import torch

from .primitives import describe_phase

EXIT_CODE = 75


class HandshakeWatchdog:
    def __init__(
        self,
        rank: int,
        timeout_s: float,
        *,
        on_timeout: Callable[[str], None] | None = None,
        notices: Callable[[], str] | None = None,
        poll_s: float | None = None,
    ):
        self.rank = rank
        self.timeout_s = timeout_s
        self.error: str | None = None
        self._on_timeout = on_timeout or _abort
        self._notices = notices or (lambda: "")
        self._poll_s = poll_s if poll_s is not None else min(0.05, max(0.002, timeout_s / 100))
        self._marker: torch.Tensor | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, marker: torch.Tensor) -> None:
        """Start watching `marker` (two words in host memory: the token of the phase the stream reached last, and
        that token again once it passed, 0 while it waits)."""
        self._marker = marker
        self._thread = threading.Thread(target=self._run, name=f"ulysses-watchdog-r{self.rank}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # never die silently: the process would run on unwatched
            self.error = f"{type(exc).__name__}: {exc}"
            print(
                f"[telefuser] rank {self.rank}: the Ulysses handshake watchdog failed: {self.error}",
                file=sys.stderr,
                flush=True,
            )

    def _loop(self) -> None:
        words = self._marker.numpy()  # a view of the host memory the copy stream writes: no CUDA call per read
        stalled: tuple[int, float] | None = None  # (token, when first seen waiting)
        while not self._stop.wait(self._poll_s):
            passed, reached = int(words[1]), int(words[0])
            if passed != 0 or reached == 0:  # between phases, or none issued yet
                stalled = None
                continue
            now = time.monotonic()
            if stalled is None or stalled[0] != reached:
                stalled = (reached, now)
            elif now - stalled[1] > self.timeout_s:
                self._on_timeout(
                    f"[telefuser] rank {self.rank}: {describe_phase(reached)} of the Ulysses copy engine (eager, or "
                    f"a CUDA graph replay of it) did not complete within {self.timeout_s:g}s of the copy stream "
                    "reaching it: a peer died, "
                    "raised before submitting its part of the group, or runs a different call sequence"
                    + self._notices()
                    + ". The copy stream is blocked in a GPU wait that cannot be cancelled; ending the process."
                )
                return


def _abort(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)
