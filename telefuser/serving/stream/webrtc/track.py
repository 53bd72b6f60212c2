"""The session's video track: encoded frames queued per chunk, sent at the session's FPS.

aiortc's sender calls `recv()` for the next frame; it waits until the frame is due, one frame interval after the one
before (or, for a chunk's first frame, at once when the queue ran dry: a model slower than real time), and stamps it
with that time on the 90 kHz RTP clock, so a pause between chunks looks to the browser like a paused camera, not like
network jitter that would grow its playout delay. Within a chunk frames are always one interval apart on that clock
(a frame whose encode came late goes out late with its due stamp), which is how the page places a frame in its chunk. This track is the viewer's playout clock: what it has sent is what the generator's
playout gate counts as played, and the first frame of every chunk is announced (`on_chunk_start`) with its RTP
offset so that the page can tell which chunk, and so which control, a frame on screen came from, and with `paced_ms`,
how long that frame waited in the queue for its due time (the pacing the page subtracts from the transport overhead:
PROTOCOL.md, "Measuring the transport overhead").
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RTP_CLOCK = 90_000


class PacedVideoTrack(MediaStreamTrack):
    kind = "video"

    def __init__(
        self,
        fps: float,
        *,
        on_sent: Callable[[int, int], None],
        on_chunk_start: Callable[[dict[str, Any]], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self.interval = 1.0 / float(fps)
        self.on_sent, self.on_chunk_start, self.clock = on_sent, on_chunk_start, clock
        # (packet, chunk info on its first frame, when it was queued on `clock`)
        self.queue: deque[tuple[Any, dict[str, Any] | None, float]] = deque()
        self.waiting = 0  # frames of the chunk being encoded that are not queued yet
        self.sent = 0
        self.bytes = 0
        self._arrived = asyncio.Event()
        self._next_due: float | None = None
        self._origin: float | None = None

    @property
    def queued(self) -> int:
        return len(self.queue) + self.waiting

    def push(self, packet, chunk: dict[str, Any] | None) -> None:
        """One encoded frame; `chunk` (index, first_frame, frames, control_seq...) rides on a chunk's first frame."""
        self.queue.append((packet, chunk, self.clock()))
        self._arrived.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until every queued frame was sent (or the timeout); True when drained."""
        deadline = self.clock() + timeout_s
        while self.queue and self.readyState == "live" and self.clock() < deadline:
            await asyncio.sleep(self.interval / 2)
        return not self.queue

    async def recv(self):
        while not self.queue:
            if self.readyState != "live":
                raise MediaStreamError
            self._arrived.clear()
            await self._arrived.wait()
        now = self.clock()
        due = self._next_due  # when the pacing lets this frame go (None: the first frame)
        if self._next_due is None or (self.queue[0][1] is not None and now > self._next_due):
            self._next_due = now  # the first frame, or a chunk after the queue ran dry: start the clock again
        await asyncio.sleep(max(0.0, self._next_due - now))
        if not self.queue:  # stopped while waiting
            raise MediaStreamError
        packet, chunk, queued_at = self.queue.popleft()
        sent_at = self._next_due
        # waited for its due time: from queued to due (or to sent, when the sender came late); 0 for a frame that
        # came after its due time
        paced_s = 0.0 if due is None else max(0.0, min(due, sent_at) - queued_at)
        self._next_due += self.interval
        if self._origin is None:
            self._origin = sent_at
        packet.pts = round((sent_at - self._origin) * RTP_CLOCK)
        packet.time_base = fractions.Fraction(1, RTP_CLOCK)
        self.sent += 1
        self.bytes += packet.size
        if chunk is not None:
            self.on_chunk_start({**chunk, "rtp_offset": packet.pts, "paced_ms": round(paced_s * 1000, 3)})
        self.on_sent(self.sent, len(self.queue))
        return packet

    def stop(self) -> None:
        super().stop()
        self.queue.clear()
        self._arrived.set()
