"""The page's WebSocket playout (telefuser/serving/stream/static/ws_player.js) in Python: chunk envelopes decoded in
order into a frame queue, frames drawn at the session's FPS on a 60 Hz display clock, playback starting as the page's
does (realtime: the first decoded frame; lossless: two chunks or the buffer), and the page's playout reports. A chunk
whose first frame is decoded and queued could be drawn at the next display tick: the end of its transport overhead
(measure.py), whatever the playout then makes it wait."""

from __future__ import annotations

import asyncio
import io
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from telefuser.serving.stream.envelope import unpack
from tools.bench.stream_latency.measure import Measure

DISPLAY_HZ = 60.0
REPORT_INTERVAL_S = 0.1


def decode_jpeg_or_png(images: list[bytes]) -> None:
    """Decode the frames as the browser would (the cost is part of the latency); the pixels are not kept."""
    from PIL import Image

    for data in images:
        Image.open(io.BytesIO(data)).convert("RGB").load()


class PagePlayout:
    def __init__(self, measure: Measure, send: Callable[[dict[str, Any]], Awaitable[None]], *, decode: bool = True):
        self.measure, self.send, self.decode = measure, send, decode
        self.fps = 16.0
        self.prebuffer_chunks = 0
        self.queue: deque[tuple[int | None, int]] = deque()  # (control seq, chunk) per decoded frame
        self.received = self.drawn = 0
        self.decoded_chunks = self.started_chunks = 0
        self.playing = self.done = False
        self.last_report = 0.0
        self._decoding: asyncio.Queue = asyncio.Queue()
        self.ready_chunks: list[tuple[int, float | None]] = []  # (chunk, computed_at) decoded since the last tick
        self._tasks: list[asyncio.Task] = []

    @property
    def held(self) -> int:
        return self.received - self.drawn

    def configure(self, ready: dict[str, Any]) -> None:
        self.fps = float(ready.get("fps") or 16)
        realtime = ready.get("delivery_mode") == "realtime"
        self.prebuffer_chunks = 0 if realtime else min(2, int(ready.get("buffer_chunks") or 2))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._decoder()), asyncio.create_task(self._display())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def envelope(self, data: bytes) -> dict[str, Any]:
        """A binary message: counted at arrival, decoded in order."""
        header, images = unpack(data)
        self.received += header["frames"]
        self.measure.chunk_arrived(time.perf_counter(), len(data))
        self.measure.held(self.held)
        self._decoding.put_nowait((header, images))
        return header

    async def report(self, force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - self.last_report >= REPORT_INTERVAL_S:
            self.last_report = now
            await self.send({"type": "playout", "frames_played": self.drawn, "frames_buffered": self.held})

    async def _decoder(self) -> None:
        """Frames join the queue in order as each decodes, as on the page: a chunk's first frame is drawable before
        its last one is decoded."""
        while True:
            header, images = await self._decoding.get()
            decode = self.decode and header.get("codec") in ("jpeg", "png")
            frame = (header.get("control_seq"), header["chunk"])
            for index in range(header["frames"]):
                if decode and index < len(images):
                    await asyncio.to_thread(decode_jpeg_or_png, images[index : index + 1])
                self.queue.append(frame)
                if index == 0:
                    self.ready_chunks.append((header["chunk"], header.get("computed_at")))
            if not header["frames"]:
                self.ready_chunks.append((header["chunk"], header.get("computed_at")))
            self.decoded_chunks += 1

    def _ready(self) -> bool:
        if self.done or self.prebuffer_chunks == 0:
            return bool(self.queue)
        return self.decoded_chunks - self.started_chunks >= self.prebuffer_chunks

    async def _display(self) -> None:
        clock = since = 0
        while True:
            now, wall_ms = time.perf_counter(), time.time() * 1000
            for chunk, computed_at in self.ready_chunks:  # drawable from this tick
                self.measure.transported(chunk, computed_at, wall_ms)
            self.ready_chunks = []
            if not self.playing and self._ready():
                self.playing, clock, since = True, now, 0
                self.measure.stalled(False, now)
                await self.report(True)
            if self.playing:
                due, drew = int((now - clock) * self.fps), False
                while since <= due and self.queue:
                    seq, chunk = self.queue.popleft()
                    self.drawn += 1
                    self.started_chunks = max(self.started_chunks, chunk + 1)
                    self.measure.drawn(seq, chunk, now)
                    since, drew = since + 1, True
                if since <= due and not self.queue:
                    self.playing = False
                    if not self.done:
                        self.measure.stalled(True, now)
                    await self.report(True)
                elif drew:
                    await self.report()
            await asyncio.sleep(1 / DISPLAY_HZ)
