"""One session driven as the web page drives it: POST /v1/stream/sessions, then its WebSocket: chunk envelopes and
their events in, controls and the delivery ack out. What arrives is counted by the plugin's StreamSession, so the
verdict is the AIPerf benchmark's; what is sent when comes from the plugin's ControlSchedule."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tools.aiperf.telefuser_aiperf.control_schedule import ControlSchedule
from tools.aiperf.telefuser_aiperf.controls import ControlStep
from tools.aiperf.telefuser_aiperf.session import StreamSession
from tools.aiperf.telefuser_aiperf.sse import SSEEvent
from tools.bench.stream_drive.envelopes import EnvelopePairing
from tools.bench.stream_drive.frames import FrameChecks
from tools.bench.stream_drive.plan import DrivePlan
from tools.bench.stream_drive.progress import Progress, log

now_ns = time.perf_counter_ns
STATUS_STAGES = ("runtime_ready", "control_state")  # text messages the state machine takes as status events


@dataclass
class Context:
    """What every session of a run shares."""

    args: argparse.Namespace
    base: str
    http: httpx.AsyncClient
    plan: DrivePlan
    decoder: concurrent.futures.Executor
    ws_headers: dict[str, str] = field(default_factory=dict)


class SessionDriver:
    def __init__(self, number: int, ctx: Context):
        self.number, self.ctx, self.args = number, ctx, ctx.args
        self.prompt = ctx.plan.prompt(number)
        self.state = StreamSession(ctx.plan.options, now_ns())
        self.protocol: list[str] = []  # decode failures, the final status; the pairing keeps its own
        self.warnings: list[str] = []
        self.pairing = EnvelopePairing()
        self.frames = FrameChecks(ctx.decoder, enabled=not self.args.no_decode)
        self.controls = ControlSchedule(self.state, self._send_control, asap=self.args.control_timing == "asap")
        self.confirmed: dict[int, asyncio.Event] = {}
        self.chunk_info: dict[int, dict[str, Any]] = {}  # bytes, queue depth, encode seconds per chunk
        self.created_ns = self.connected_ns = self.ended_ns = None
        self.waiting_for = "the create answer"
        self.ack_sent = False
        self.final_status: dict[str, Any] | None = None
        self.progress: Progress | None = None
        self.ws = None  # the open WebSocket, for controls

    # ---- the run ---------------------------------------------------------------------------------------------------
    async def run(self) -> SessionDriver:
        deadline = asyncio.timeout(self.args.session_timeout)
        try:
            async with deadline:
                if await self._create():
                    await self._stream()
        except TimeoutError as exc:
            if not deadline.expired():  # the WebSocket handshake's own timeout
                self.ended(f"timed out waiting for {self.waiting_for}: {exc!r}")
                return self
            self.ended(
                f"the session did not finish within --session-timeout {self.args.session_timeout:g} s "
                f"(it was waiting for {self.waiting_for})"
            )
        except Exception as exc:  # noqa: BLE001 - refused, reset, a bad answer: this session failed, not the run
            self.ended(f"the session failed while waiting for {self.waiting_for}: {type(exc).__name__}: {exc}")
        finally:
            self.ended_ns = self.ended_ns or now_ns()
            if self.progress is not None:
                self.progress.close()
            await self._settle()
        return self

    def ended(self, reason: str) -> None:
        """Why the session stopped early, put where the verdict looks: before done, at the ack, or after it."""
        if self.state.done is None:
            self.state.stream_ended(reason)
        elif self.state.ack_answer is None and not self.state.ack_problems:
            self.state.ack_problems = [reason]
        else:
            self.protocol.append(reason)

    async def _create(self) -> bool:
        """POST the session, retrying a busy answer (429) for up to --slot-wait; False when it was not created."""
        url = f"{self.ctx.base}/v1/stream/sessions"
        body = self.ctx.plan.options.body(self.prompt.text, self.prompt.image_b64)
        deadline = time.monotonic() + self.args.slot_wait
        while True:
            self.state.start_ns = now_ns()
            try:
                r = await self.ctx.http.post(url, json=body, timeout=self.args.create_timeout)
            except httpx.HTTPError as exc:
                self.ended(f"POST {url} failed (timeout {self.args.create_timeout:g} s): {type(exc).__name__}: {exc}")
                return False
            if r.status_code != 429 or time.monotonic() >= deadline:
                break
            await asyncio.sleep(_retry_after_s(r))  # the slot of the session before is not free yet
        self.created_ns = now_ns()
        if not 200 <= r.status_code < 300:
            busy = f" after retrying for --slot-wait {self.args.slot_wait:g} s" if r.status_code == 429 else ""
            self.ended(f"POST {url} answered {r.status_code}{busy}: {r.text[:500]}")
            return False
        try:
            self.state.created(r.json())
        except ValueError as exc:
            self.ended(f"POST {url} answered {r.status_code} with an unusable body: {exc}")
            return False
        answer = self.state.create_answer
        self.progress = Progress(self.args.progress, self.number, self.state.expected_chunks)
        log(
            f"session {self.number}: {self.state.session_id} created in "
            f"{(self.created_ns - self.state.start_ns) / 1e9:.2f} s: {self.state.expected_chunks} chunks, "
            f"{answer.get('total_frames')} frames, {answer.get('resolution')}, codec {answer.get('codec')}"
        )
        return True

    async def _stream(self) -> None:
        answer = self.state.create_answer or {}
        base = self.ctx.base
        ws_url = ("wss" + base[5:] if base.startswith("https") else "ws" + base[4:]) + str(
            answer.get("ws_path") or f"/v1/stream/sessions/{self.state.session_id}/ws"
        )
        self.waiting_for = f"the WebSocket handshake (--connect-timeout {self.args.connect_timeout:g} s)"
        async with connect(
            ws_url,
            max_size=None,
            proxy=None,
            open_timeout=self.args.connect_timeout,
            close_timeout=10,
            ping_interval=None,  # silence is judged by --stall-timeout
            compression="deflate" if self.args.ws_compression == "deflate" else None,
            additional_headers=self.ctx.ws_headers or None,
        ) as ws:
            self.connected_ns, self.ws = now_ns(), ws
            self.controls.start()
            try:
                await self._receive(ws)
            finally:
                if await self.controls.settle():
                    self.warnings.append("a control send did not finish within 30 s of the stream's end")

    # ---- what arrives ----------------------------------------------------------------------------------------------
    def _limit_and_wait(self) -> float:
        """The silence allowed now, and (in self.waiting_for) what for."""
        if self.ack_sent:
            self.waiting_for = "the service's delivery_ack answer"
            return self.args.ack_wait
        self.waiting_for = f"chunk {len(self.state.chunks)} of {self.state.expected_chunks}"
        if self.pairing.pending is not None:
            self.waiting_for = f"the chunk_sent event of chunk {self.pairing.pending.index}"
        return self.args.stall_timeout

    async def _receive(self, ws) -> None:
        while True:
            limit = self._limit_and_wait()
            try:
                message = await asyncio.wait_for(ws.recv(), limit)
            except TimeoutError:
                self.ended(f"no message from the service for {limit:g} s while waiting for {self.waiting_for}")
                return
            except ConnectionClosed as exc:
                how = f"code {exc.rcvd.code} {exc.rcvd.reason!r}" if exc.rcvd is not None else "no close frame"
                self.ended(f"the WebSocket closed ({how}) while waiting for {self.waiting_for}")
                return
            t = now_ns()
            if isinstance(message, bytes):
                self._on_envelope(message, t)
            elif await self._on_text(ws, message, t):
                return

    def _on_envelope(self, data: bytes, t: int) -> None:
        envelope = self.pairing.envelope(data, t, len(self.state.chunks))
        if envelope is None:
            return
        self.frames.submit(envelope.header, envelope.images)
        if self.progress is not None:
            self.progress.chunk(int(envelope.index), self.state.counted_frames + len(envelope.images))

    async def _on_text(self, ws, message: str, t: int) -> bool:
        """One event of the service's; True when the session is over."""
        try:
            event = json.loads(message)
            stage = event.get("stage")
        except (ValueError, AttributeError):
            self.protocol.append(f"unreadable text message from the service: {message[:200]!r}")
            return False
        if stage == "chunk_sent":
            self._on_chunk_sent(event)
        elif stage in STATUS_STAGES:
            self.state.on_event(SSEEvent(perf_ns=t, event="status", data=message))
            if stage == "control_state":
                self._on_control_state(t)
            elif event.get("total_chunks") != self.state.expected_chunks:
                self.protocol.append(
                    f"runtime_ready declares {event.get('total_chunks')} chunks, the create "
                    f"answer {self.state.expected_chunks}"
                )
        elif stage == "error":
            return self.state.on_event(SSEEvent(perf_ns=t, event="error", data=message)) == "fatal"
        elif stage == "done":
            self.state.on_event(SSEEvent(perf_ns=t, event="done", data=message))
            return not await self._send_ack(ws)
        elif stage == "delivery_ack":
            self.state.record_ack(event, None)
            return True
        elif stage == "closed":
            self.state.on_event(SSEEvent(perf_ns=t, event="closed", data=message))
            self.ended(f"the service closed the stream (reason {event.get('reason')!r}) before its delivery_ack")
            return True
        return False

    def _on_chunk_sent(self, event: dict[str, Any]) -> None:
        paired = self.pairing.chunk_sent(event, (self.state.create_answer or {}).get("resolution"))
        if paired is None:
            return
        try:
            self.state.on_event(paired.event)
        except ValueError as exc:  # ChunkObservation: a chunk index or frame count that is not an integer
            self.protocol.append(f"chunk {paired.index}: {exc}")
            return
        self.chunk_info[paired.index] = paired.info
        self.controls.on_chunk(paired.index)

    def _on_control_state(self, t: int) -> None:
        """The state matched a control_state to the control it confirms (stamped `t`): record the answer."""
        for number, result in enumerate(self.state.controls):
            if result.state_ns == t and result.answered_ns is None:
                result.answered_ns = t
                result.answer = next(p for n, p in reversed(self.state.status_events) if n == t)
                self.confirmed.setdefault(number, asyncio.Event()).set()

    # ---- what goes out ---------------------------------------------------------------------------------------------
    async def _send_ack(self, ws) -> bool:
        try:
            await ws.send(json.dumps({"type": "delivery_ack", "published_frames": self.state.counted_frames}))
        except ConnectionClosed as exc:
            self.ended(f"the WebSocket closed before our delivery_ack could be sent: {exc}")
            return False
        self.ack_sent = True
        return True

    async def _send_control(self, step: ControlStep) -> None:
        if self.ws is None or self.state.done is not None:
            return
        result = self.state.control_sent(step, now_ns())
        number = len(self.state.controls) - 1
        try:
            await self.ws.send(json.dumps({"type": "control", "keys": list(step.keys)}))
        except ConnectionClosed as exc:  # the socket closed under us; the stream's end says why
            result.answer = f"not sent: {type(exc).__name__}: {exc}"
            return
        if self.controls.asap:  # a burst: each step after the service confirmed the one before
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.confirmed.setdefault(number, asyncio.Event()).wait(), self.args.ack_wait)

    # ---- after the stream ------------------------------------------------------------------------------------------
    async def _settle(self) -> None:
        """Collect the frame checks; free the slot of a session that did not end normally; read its final status."""
        self.pairing.finish()
        self.protocol += await self.frames.settle()
        sid = self.state.session_id
        if sid is None:
            return
        url = f"{self.ctx.base}/v1/stream/sessions/{sid}"
        if self.state.done is None:
            with contextlib.suppress(Exception):
                await self.ctx.http.delete(url, timeout=10)
        try:
            r = await self.ctx.http.get(url, timeout=10)
            self.final_status = r.json() if r.status_code == 200 else {"status_code": r.status_code, "body": r.text}
        except (httpx.HTTPError, ValueError) as exc:
            self.final_status = {"error": f"GET {url} failed: {type(exc).__name__}: {exc}"}


def _retry_after_s(response: httpx.Response) -> float:
    try:
        retry_after = float(response.headers.get("retry-after") or 1)
    except ValueError:
        retry_after = 1.0
    return min(5.0, max(0.5, retry_after))
