"""Bounded playout: how far a session's generator may run ahead of what its viewer has played.

The viewer's client reports the frames it has displayed (`playout` messages on the WebSocket; the WebRTC video track
reports the frames it has paced out itself). Until a client reports, the frames handed to the transport count as
played. Outstanding frames = generated - played: the server's queue, the network, the client's buffer.

* Cap (both delivery modes, once the client reports; realtime mode always): a chunk starts only if, once computed,
  the outstanding frames stay within the announced buffer (`buffer_chunks` x the model's chunk frames). The client
  holds a part of the outstanding frames, so it never holds more than the announced buffer either.
* Just in time (realtime mode, reporting clients): a chunk starts once the outstanding frames fall to what the
  viewer plays while one chunk is computed and encoded (running means) plus `LEAD_MARGIN_S`; keys are read when it
  starts, so a control waits at most one chunk interval plus that lead before it is computed.

A model slower than real time never waits here: its viewer's buffer runs dry between chunks, which the page says.
Lossless delivery to a client that does not report (the AIPerf replay, tools) is the delivery FIFO's business alone.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

LEAD_MARGIN_S = 0.3  # network, decode and report intervals on top of one chunk's compute
COMPUTE_SMOOTHING = 0.5  # weight of the newest chunk in the running mean of compute seconds


class PlayoutGate:
    def __init__(
        self,
        *,
        fps: float,
        buffer_frames: int,
        realtime: bool,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.fps, self.buffer_frames, self.realtime, self.clock = float(fps or 16), int(buffer_frames), realtime, clock
        self.generated = 0  # frames computed
        self.sent = 0  # frames handed to the transport
        self.played = 0  # frames the viewer reports displayed (clamped to what was sent)
        self.reporting = False  # the viewer reports playout
        self.client_buffered = 0  # frames the client says it holds (received, not displayed)
        self.client_buffered_max = 0
        self.compute_s: float | None = None  # running mean: one chunk's compute (and envelope encode) seconds
        self.deliver_s = 0.0  # running mean: what the consumer spends on a chunk before it can play (video encode)
        self.waited_s = 0.0
        self._changed = asyncio.Event()

    # ---- what happened -------------------------------------------------------------------------------------------
    def on_generated(self, frames: int, seconds: float) -> None:
        self.generated += frames
        if self.compute_s is None:
            self.compute_s = seconds
        else:
            self.compute_s += COMPUTE_SMOOTHING * (seconds - self.compute_s)

    def on_encoded(self, seconds: float) -> None:
        """The consumer's own work on a chunk before its first frame can go out (WebRTC: the video encode)."""
        self.deliver_s += COMPUTE_SMOOTHING * (seconds - self.deliver_s)

    def on_sent(self, frames: int) -> None:
        self.sent += frames
        self._changed.set()

    def on_played(self, played: int, buffered: int | None = None) -> None:
        """A client's playout report: `played` frames displayed so far (never more than it was sent), `buffered`
        held by the client."""
        self._played(min(int(played), self.sent), buffered)

    def on_track_sent(self, sent: int, queued: int) -> None:
        """The WebRTC track, the viewer's playout clock, sent its `sent`-th frame; it takes each frame as soon as it
        is encoded, before the chunk counts as sent, and never one that was not generated."""
        self._played(min(sent, self.generated), queued)

    def _played(self, played: int, buffered: int | None) -> None:
        self.reporting = True
        self.played = max(self.played, played)
        if buffered is not None:
            self.client_buffered = int(buffered)
            self.client_buffered_max = max(self.client_buffered_max, self.client_buffered)
        self._changed.set()

    def expect_reports(self) -> None:
        """The consumer's transport reports playout itself (the WebRTC track), from before its first frame: the
        generator does not run ahead while the connection comes up."""
        self.reporting = True
        self._changed.set()

    def wake(self) -> None:
        """Re-check (stop requested, session closing)."""
        self._changed.set()

    # ---- what may happen -----------------------------------------------------------------------------------------
    @property
    def gated(self) -> bool:
        return self.reporting or self.realtime

    @property
    def outstanding(self) -> int:
        return self.generated - (self.played if self.reporting else self.sent)

    def lead_frames(self) -> int | None:
        """The outstanding frames below which a just-in-time chunk starts; None: start as soon as it fits."""
        if not (self.realtime and self.reporting and self.compute_s is not None):
            return None
        return math.ceil((self.compute_s + self.deliver_s + LEAD_MARGIN_S) * self.fps)

    def may_start(self, frames: int) -> bool:
        if not self.gated:
            return True
        if self.outstanding + frames > self.buffer_frames:
            return False
        lead = self.lead_frames()
        return lead is None or self.outstanding <= lead

    async def wait_to_start(self, frames: int, stop: Callable[[], bool]) -> float:
        """Wait until a chunk of `frames` may start (or `stop()` says to stop); returns the seconds waited."""
        t0 = self.clock()
        while not stop() and not self.may_start(frames):
            self._changed.clear()
            await self._changed.wait()
        waited = self.clock() - t0
        self.waited_s += waited
        return waited
