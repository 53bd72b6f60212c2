"""Progress on stderr: a tqdm bar per session on a terminal, else a line every tenth of the chunks."""

from __future__ import annotations

import sys
import time


def log(message: str) -> None:
    print(f"== {message}", file=sys.stderr, flush=True)


class Progress:
    def __init__(self, mode: str, number: int, total: int | None):
        self.number, self.total, self.bar, self.mode = number, total, None, mode
        self.step = max(1, (total or 10) // 10)
        self.started = time.monotonic()
        if mode in ("auto", "tqdm"):
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None and (mode == "tqdm" or sys.stderr.isatty()):
                self.bar = tqdm(
                    total=total, desc=f"session {number}", unit="chunk", file=sys.stderr, position=number - 1
                )
            self.mode = "tqdm" if self.bar is not None else "lines"

    def chunk(self, index: int, frames: int) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(frames=frames, refresh=False)
        elif self.mode == "lines" and (index % self.step == 0 or (self.total and index + 1 == self.total)):
            elapsed = time.monotonic() - self.started
            log(f"session {self.number}: chunk {index + 1}/{self.total} ({frames} frames, {elapsed:.1f} s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
