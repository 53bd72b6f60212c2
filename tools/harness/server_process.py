"""A server command (`telefuser serve`, `serve-stream`, the same under torchrun) as a child process in its own process
group, its stdout and stderr read line by line in the background: the tests wait for its log lines, signal it as a
terminal or a supervisor would, and kill what is left at the end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVING_ON = r"serving on (http://\S+)"  # the start line every server prints once it listens


class ServerProcess:
    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path = REPO):
        """`argv` as given; a leading "telefuser" runs `python -m telefuser.cli` of this interpreter."""
        if argv and argv[0] == "telefuser":
            argv = [sys.executable, "-m", "telefuser.cli", *argv[1:]]
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own group: a signal reaches torchrun's workers too
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, pattern: str, timeout_s: float = 60.0, *, poll_s: float = 0.02) -> re.Match:
        """The first log line matching `pattern` (re.search); an AssertionError with the log when the process ends
        or `timeout_s` passes first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if match := regex.search(line):
                    return match
            seen = len(self.lines)
            if self.proc.poll() is not None:
                self._reader.join(2)  # its last lines
                if match := next(filter(None, map(regex.search, self.lines[seen:])), None):
                    return match
                raise AssertionError(f"exited with {self.proc.returncode} before logging {pattern!r}:\n{self.log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no line matched {pattern!r} within {timeout_s:.0f} s:\n{self.log}")
            time.sleep(poll_s)

    def wait_url(self, timeout_s: float = 60.0) -> str:
        return self.wait_for_line(SERVING_ON, timeout_s).group(1)

    def send(self, sig: int = signal.SIGTERM) -> None:
        """`sig` to the whole process group (what a terminal's Ctrl-C or a supervisor's stop does)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Signal the group, then `wait`."""
        self.send(sig)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float = 30.0) -> int:
        """The exit status, once the reader has the last lines; SIGKILL and an AssertionError when the process does
        not end within `timeout_s`."""
        try:
            returncode = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout_s:.0f} s:\n{self.log}") from None
        self._reader.join(5)
        return returncode

    def kill(self) -> None:
        """SIGKILL the whole group: no shutdown path runs, as when a host is lost."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
