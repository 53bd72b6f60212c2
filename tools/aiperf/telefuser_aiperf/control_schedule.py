"""When a session's control steps are sent; the same clock for the AIPerf transport and the direct stream drive.

A control trace (controls.py) times each step either `delay_s` after chunk 0 arrived, or right after chunk k arrived
(`after_chunk`), the way a viewer presses keys while watching. `asap` instead sends every step in trace order as soon
as chunk 0 arrived, each after the send of the one before returned: how fast the control path takes a burst.
How a step goes on the wire (HTTP POST, a WebSocket message) is the caller's `send`. No aiperf imports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from .controls import ControlStep
from .session import StreamSession

SETTLE_S = 30.0  # how long sends still in flight may take once the stream is over


class ControlSchedule:
    def __init__(self, state: StreamSession, send: Callable[[ControlStep], Awaitable[object]], *, asap: bool = False):
        self.state, self.send, self.asap = state, send, asap
        self.first_chunk = asyncio.Event()
        self.over = False
        self._clock: asyncio.Task | None = None
        self._sends: list[asyncio.Task] = []

    def start(self) -> None:
        """Start the clock of the timed (or asap) steps; it waits for chunk 0."""
        self._clock = asyncio.create_task(self._run_clock())

    def on_chunk(self, index: int) -> None:
        """A chunk arrived (after the state counted it): start the clock at chunk 0, send the steps due after it."""
        if len(self.state.chunks) == 1:
            self.first_chunk.set()
        if not self.asap:
            self._sends += [asyncio.create_task(self._send(s)) for s in self.state.controls_after_chunk(index)]

    def add(self, task: asyncio.Task) -> None:
        """Another task of the session's that must finish (or be given up) with the control sends."""
        self._sends.append(task)

    async def _run_clock(self) -> None:
        await self.first_chunk.wait()
        if self.asap:
            for step in sorted(self.state.options.controls, key=lambda s: s.number):
                await self._send(step)
            return
        base = self.state.first_chunk_ns
        for step in self.state.timed_controls():
            wait_s = (base + step.delay_s * 1e9 - time.perf_counter_ns()) / 1e9
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            await self._send(step)

    async def _send(self, step: ControlStep) -> None:
        if not self.over:
            await self.send(step)

    def close(self) -> None:
        """The stream is over: no step is sent any more (sends already started go on; see `settle`)."""
        self.over = True
        if self._clock is not None:
            self._clock.cancel()

    async def settle(self, settle_s: float = SETTLE_S) -> int:
        """Wait up to `settle_s` for the sends in flight; returns how many did not finish (they are cancelled)."""
        self.close()
        tasks = [t for t in self._sends if not t.done()]
        late: set[asyncio.Task] = set()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=settle_s)
        for task in late:
            task.cancel()
        for task in self._sends:  # a send's own failure is recorded by `send`; this only retrieves it
            if task.done() and not task.cancelled():
                task.exception()
        return len(late)
