"""One streaming session at run time: its generation task, bounded delivery FIFO, controls and delivery ack.

The generator task computes chunk i+1 in a worker thread while the consumer (WebSocket, SSE or WebRTC) sends chunk i;
a full FIFO makes it wait. Before a chunk starts, the playout gate (playout.py) holds it until the viewer has played
enough (realtime mode, or a client that reports playout); the held keys are read when it starts, and every chunk
carries the control generation it was computed under, so a client can time a key press to its first frame on screen.
The data flow, and why `close()` never meets a running `next_chunk()`, are in serving/README.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any


from ..common.out_of_memory import (
    STREAM_ADVICE,
    free_cached_memory,
    is_out_of_memory,
    out_of_memory_message,
    what_ran_out,
)
from ..common.request_body import encodable_text
from .contract import StreamSession, parse_resolution
from .events import KEEPALIVE, ChunkItem, DoneItem, Notice, next_chunk_stamped, prepare_chunk
from .metrics import StreamMetrics
from .playout import PlayoutGate
from .settings import StreamSettings

log = logging.getLogger("telefuser.serving")


class StateError(Exception):
    """An operation that the session's state does not allow (second consumer, closed session...)."""


class StreamSessionState:
    def __init__(
        self,
        session_id: str,
        model: StreamSession,
        *,
        prompt: str,
        config: dict[str, Any],
        codec: str,
        settings: StreamSettings,
        metrics: StreamMetrics,
        run_blocking: Callable[..., asyncio.Future],
        on_released: Callable[[StreamSessionState], None],
        on_closed: Callable[[StreamSessionState], None],
        chunk_frames: int = 16,
    ):
        self.id, self.model, self.prompt, self.config, self.codec = session_id, model, prompt, config, codec
        self.settings, self.metrics = settings, metrics
        self._run, self._on_released, self._on_closed = run_blocking, on_released, on_closed
        self.fps = config.get("fps")
        self.resolution = config.get("resolution")
        self.width, self.height = parse_resolution(self.resolution) if self.resolution else (None, None)
        self.total_chunks: int | None = model.total_chunks
        self.total_frames: int | None = getattr(model, "total_frames", None)
        self.created_at = time.monotonic()
        self.state = "created"  # created -> streaming -> done -> closed
        self.consumer: str | None = None
        self.fifo: asyncio.Queue = asyncio.Queue(maxsize=settings.buffer_chunks)
        self.notices: asyncio.Queue = asyncio.Queue()
        self.keys: list[str] = []
        self.control = {"generation": 0, "seq": None}  # bumped by every accepted control; chunks carry it
        self.next_index = 0  # the chunk that controls received now apply to
        self.chunk_frames = chunk_frames  # the model's frames per (later) chunk: the buffer's unit
        self.playout = PlayoutGate(
            fps=self.fps or 16,
            buffer_frames=settings.buffer_chunks * chunk_frames,
            realtime=settings.delivery_mode == "realtime",
        )
        self.started_at: float | None = None
        self.stop_requested = False
        self.chunks_generated = self.frames_generated = 0
        self.chunks_sent = self.frames_sent = self.chunks_dropped = self.frames_dropped = 0
        self.published_frames: int | None = None  # declared in done
        self.acked_frames: int | None = None
        self.ack_event = asyncio.Event()
        self.close_reason: str | None = None
        self.stream_token: str | None = None  # set by the registry; a query token for this session's stream
        self.model_released = False
        self._task: asyncio.Task | None = None
        self._inflight: asyncio.Future | None = None
        self._release: asyncio.Future | None = None
        self._closed = False
        self._close_done = asyncio.Event()

    # ---- consumer side -------------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def attach(self, consumer: str, *, images: bool, pixels: bool = False) -> None:
        """Bind the one consumer and start generating; images=False skips frame encoding (events only); pixels=True
        keeps each chunk's frames for a consumer that encodes video itself."""
        if self._closed:
            raise StateError(f"session {self.id} is closed ({self.close_reason})")
        if self.consumer is not None:
            raise StateError(f"session {self.id} already has a consumer ({self.consumer}); one stream per session")
        self.consumer, self.state, self.started_at = consumer, "streaming", time.monotonic()
        length = f"{self.total_frames} frames" if self.total_frames is not None else "open-ended"
        log.info(
            "session %s: started (%s, %s at %s fps, %s, %s delivery, buffer %d chunks)",
            self.id,
            consumer,
            self.resolution,
            self.fps,
            length,
            self.settings.delivery_mode,
            self.settings.buffer_chunks,
        )
        self._task = asyncio.get_running_loop().create_task(
            self._generate(self.codec if images else None, pixels), name=f"stream-{self.id}"
        )

    async def events(self, keepalive_s: float | None = None) -> AsyncIterator[Any]:
        """What the consumer must send, in order: notices jump ahead of queued chunks; ends after done or a final
        notice."""
        get_note = get_item = None
        try:
            while True:
                get_note = get_note or asyncio.ensure_future(self.notices.get())
                get_item = get_item or asyncio.ensure_future(self.fifo.get())
                done, _ = await asyncio.wait(
                    {get_note, get_item}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    yield KEEPALIVE
                elif get_note in done:
                    note, get_note = get_note.result(), None
                    yield note
                    if note.final:
                        return
                else:
                    item, get_item = get_item.result(), None
                    yield item
                    if isinstance(item, DoneItem):
                        return
        finally:
            for task in (get_note, get_item):
                if task is not None:
                    task.cancel()

    def ready_payload(self) -> dict[str, Any]:
        return {
            "type": "status",
            "stage": "runtime_ready",
            "session_id": self.id,
            "total_chunks": self.total_chunks,
            "total_frames": self.total_frames,
            "fps": self.fps,
            "resolution": self.resolution,
            "width": self.width,
            "height": self.height,
            "delivery_mode": self.settings.delivery_mode,
            "buffer_chunks": self.settings.buffer_chunks,
            "buffer_frames": self.playout.buffer_frames,
            "chunk_frames": self.chunk_frames,
            "codec": self.codec,
            "keys": list(self.settings.keys),
            "control_generation": self.control["generation"],
        }

    def mark_sent(self, item: ChunkItem, nbytes: int) -> dict[str, Any]:
        """Count a delivered chunk; returns its event fields (shared by chunk_sent and the SSE chunk event)."""
        self.chunks_sent += 1
        self.frames_sent += item.frames
        self.playout.on_sent(item.frames)
        self.metrics.inc("chunks_sent_total")
        self.metrics.inc("frames_sent_total", item.frames)
        self.metrics.inc("bytes_sent_total", nbytes)
        return {
            "chunk": item.index,
            "frames": item.frames,
            "first_frame": item.first_frame,
            "checksum": item.checksum,
            "bytes": nbytes,
            "queue_depth": self.fifo.qsize(),
            "encode_seconds": round(item.encode_seconds, 6),
            "measurement": item.measurement,
            **item.control_fields(),
            **item.computed_fields(),
        }

    def done_payload(self, item: DoneItem) -> dict[str, Any]:
        self.published_frames, self.state = self.frames_sent, "done"
        return {
            "type": "status",
            "stage": "done",
            "published_frames": self.frames_sent,
            "chunks": self.chunks_sent,
            "reason": item.reason,
            "dropped_frames": self.frames_dropped,
        }

    def ack_payload(self) -> dict[str, Any]:
        return {
            "type": "status",
            "stage": "delivery_ack",
            "received": self.acked_frames is not None,
            "published_frames": self.published_frames,
            "acked_frames": self.acked_frames,
            "match": self.ack_matches,
        }

    @property
    def ack_matches(self) -> bool | None:
        if self.acked_frames is None:
            return None
        return self.acked_frames == self.published_frames

    # ---- client messages -----------------------------------------------------------------------------------------
    def set_controls(self, keys: list[str], seq: int | None = None) -> dict[str, Any]:
        """Hold `keys` from the next chunk that has not started, as a new control generation (`seq`: the client's own
        number for this control, echoed back); acknowledged with a control_state notice, whose fields it returns."""
        if self._closed:
            raise StateError(f"session {self.id} is closed")
        self.keys = list(keys)
        self.control = {"generation": self.control["generation"] + 1, "seq": seq}
        self.metrics.inc("controls_total")
        state = {
            "keys": self.keys,
            "applies_from_chunk": self.next_index,
            "generation": self.control["generation"],
            "seq": seq,
        }
        self._notify({"type": "status", "stage": "control_state", **state})
        return state

    def record_playout(self, played: int, buffered: int | None) -> None:
        """A playout report from the client: frames displayed so far, frames it holds."""
        if self._closed:
            raise StateError(f"session {self.id} is closed")
        self.playout.on_played(played, buffered)
        self.metrics.inc("playout_reports_total")
        if buffered is not None and buffered > self.playout.buffer_frames:
            self.metrics.inc("playout_over_buffer_total")

    def client_error(self, message: str) -> None:
        """A bad client message: reported as a non-fatal error event; the stream goes on."""
        self.metrics.inc("control_errors_total")
        self._notify({"type": "status", "stage": "error", "message": message, "fatal": False})

    def _notify(self, payload: dict[str, Any]) -> None:
        """Queue a non-final status event, unless the consumer already has `max_notices` unread: a client that floods
        controls without reading must not grow the server's memory. Final notices (closed, fatal errors) always go."""
        if self.notices.qsize() >= self.settings.max_notices:
            self.metrics.inc("notices_dropped_total")
            return
        self.notices.put_nowait(Notice(payload))

    def record_ack(self, published_frames: int) -> bool:
        if self.published_frames is None:
            raise StateError("delivery_ack is only valid after the done event")
        if self.acked_frames is None:
            self.acked_frames = published_frames
            self.metrics.inc("delivery_acks_total", result="match" if self.ack_matches else "mismatch")
            self.ack_event.set()
        return bool(self.ack_matches)

    def request_stop(self) -> None:
        """End an (open-ended) stream after the chunk in progress; done follows with reason 'stopped'."""
        self.stop_requested = True
        self.playout.wake()

    async def finish_after_ack(self) -> None:
        """After done: wait for the client's delivery_ack (bounded), then close."""
        waits = [asyncio.ensure_future(self.ack_event.wait()), asyncio.ensure_future(self._close_done.wait())]
        try:
            await asyncio.wait(waits, timeout=self.settings.ack_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        await self.aclose("completed")

    # ---- generation ----------------------------------------------------------------------------------------------
    async def _blocking(self, fn: Callable, *args: Any) -> Any:
        """Run fn in the worker pool; shielded so that cancelling us never leaves the thread running unnoticed."""
        fut = self._run(fn, *args)
        self._inflight = fut
        result = await asyncio.shield(fut)
        self._inflight = None  # the future holds the result (frames): do not keep it past its use
        return result

    async def _generate(self, codec: str | None, pixels: bool = False) -> None:
        index = first_frame = 0
        reason, failed = "completed", False
        try:
            while True:
                if self.total_chunks is None or index < self.total_chunks:  # bounded playout (playout.py)
                    waited = await self.playout.wait_to_start(self.chunk_frames, lambda: self.stop_requested)
                    self.metrics.inc("playout_wait_seconds_total", waited)
                if self.stop_requested:
                    reason = "stopped"
                    break
                if (
                    self.total_chunks is None
                    and self.settings.max_frames is not None
                    and first_frame >= self.settings.max_frames
                ):
                    reason = "frame_limit"  # an open-ended session, at the service's max_frames
                    break
                if self.total_chunks is not None and index >= self.total_chunks:
                    break
                # the latest input: the keys held now, read after the wait
                keys, control, self.next_index = list(self.keys), dict(self.control), index + 1
                t0 = time.perf_counter()
                chunk, computed_at = await self._blocking(next_chunk_stamped, self.model, keys)
                item = await self._blocking(
                    prepare_chunk,
                    chunk,
                    index,
                    first_frame,
                    codec,
                    self.settings.jpeg_quality,
                    time.perf_counter() - t0,
                    pixels,
                )
                del chunk
                item.control, item.computed_at = control, computed_at
                self.playout.on_generated(item.frames, time.perf_counter() - t0)
                index, first_frame = index + 1, first_frame + item.frames
                self.chunks_generated, self.frames_generated = index, first_frame
                self.metrics.inc("chunks_generated_total")
                self.metrics.inc("frames_generated_total", item.frames)
                self.metrics.inc("encode_seconds_total", item.encode_seconds)
                self.metrics.observe(float(item.measurement.get("compute_seconds", 0.0)))
                if self.total_chunks is not None and index >= self.total_chunks:
                    await self._release_model("completed")  # free the KV slot while the last chunks drain
                await self._publish(item)
            await self._release_model(reason)
            await self._publish(DoneItem(reason, index))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failed = True
            if is_out_of_memory(exc):  # this session no longer fits beside the others; they go on
                log.error("session %s: out of memory at chunk %d: %s", self.id, index, what_ran_out(exc))
                self.close_reason = "out_of_memory"
                message = out_of_memory_message(exc, STREAM_ADVICE, where=f" at chunk {index}")
            else:
                log.exception("session %s: generation failed at chunk %d", self.id, index)
                self.close_reason = "error"
                message = f"generation failed at chunk {index}: {type(exc).__name__}: {exc}"
            self._inflight = None  # the failed call's future holds the exception, and through it the chunk's tensors
            self.notices.put_nowait(
                Notice(
                    {"type": "status", "stage": "error", "fatal": True, "message": encodable_text(message)},
                    final=True,
                )
            )
        if failed:  # out of the except block, whose traceback holds the failed chunk's tensors
            await self._release_model(self.close_reason)

    async def _publish(self, item: ChunkItem | DoneItem) -> None:
        """Queue for the consumer; a full FIFO makes the generator wait (backpressure), nothing is dropped. In
        realtime mode the playout gate keeps the FIFO from filling."""
        if self.fifo.full():
            t0 = time.perf_counter()
            await self.fifo.put(item)
            self.metrics.inc("backpressure_seconds_total", time.perf_counter() - t0)
        else:
            self.fifo.put_nowait(item)

    # ---- teardown ------------------------------------------------------------------------------------------------
    async def _release_model(self, reason: str) -> None:
        """Close the model session once (never during next_chunk); the slot is freed when close() returns."""
        if self._release is None:
            self._release = self._run(self._close_model)
            self._release.add_done_callback(lambda _f: self._released(reason))
        await asyncio.shield(self._release)

    def _close_model(self) -> None:
        try:
            self.model.close()
        except Exception:
            log.exception("session %s: model close() failed", self.id)
        if self.close_reason == "out_of_memory":
            free_cached_memory()  # the session's buffers are gone now; whatever happens to the generator task

    def _released(self, reason: str) -> None:
        self.model_released = True
        self.model = None  # drop the model's buffers with our reference
        self.metrics.inc("sessions_closed_total", reason=reason)
        self._on_released(self)

    async def aclose(self, reason: str) -> None:
        """Stop generating, release the model slot and buffers, tell the consumer; idempotent."""
        if self._closed:
            await self._close_done.wait()
            return
        self._closed = True
        self.close_reason = self.close_reason or reason
        try:
            if self._task is not None and not self._task.done():
                self._task.cancel()
                await asyncio.wait([self._task])
            if self._inflight is not None and not self._inflight.done():
                await asyncio.wait([self._inflight])  # a next_chunk still running in its thread
            if self._inflight is not None and self._inflight.done() and not self._inflight.cancelled():
                self._inflight.exception()  # retrieved: no "exception never retrieved" noise
            await self._release_model(self.close_reason)
        finally:
            if self.published_frames is not None and self.acked_frames is None:
                self.metrics.inc("delivery_acks_total", result="missing")
            while not self.fifo.empty():
                self.fifo.get_nowait()
            self.state = "closed"
            self.notices.put_nowait(
                Notice({"type": "status", "stage": "closed", "reason": self.close_reason}, final=True)
            )
            self._task = self._inflight = None
            self._log_end()
            self._on_closed(self)
            self._close_done.set()

    def _log_end(self) -> None:
        if self.started_at is None:
            log.info("session %s: ended (%s) before a consumer attached", self.id, self.close_reason)
            return
        seconds = max(time.monotonic() - self.started_at, 1e-9)
        log.info(
            "session %s: ended (%s) after %.1f s: %d chunks, %d frames generated (%.1f FPS), %d sent (%.1f FPS), "
            "%.1f s waiting for the viewer",
            self.id,
            self.close_reason,
            seconds,
            self.chunks_generated,
            self.frames_generated,
            self.frames_generated / seconds,
            self.frames_sent,
            self.frames_sent / seconds,
            self.playout.waited_s,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "state": self.state,
            "consumer": self.consumer,
            "total_chunks": self.total_chunks,
            "total_frames": self.total_frames,
            "chunks_generated": self.chunks_generated,
            "frames_generated": self.frames_generated,
            "chunks_sent": self.chunks_sent,
            "frames_sent": self.frames_sent,
            "frames_dropped": self.frames_dropped,
            "frames_played": self.playout.played,
            "client_buffered_max": self.playout.client_buffered_max,
            "buffer_frames": self.playout.buffer_frames,
            "queue_depth": self.fifo.qsize(),
            "keys": self.keys,
            "control_generation": self.control["generation"],
            "published_frames": self.published_frames,
            "acked_frames": self.acked_frames,
            "ack_match": self.ack_matches,
            "model_released": self.model_released,
            "close_reason": self.close_reason,
        }
