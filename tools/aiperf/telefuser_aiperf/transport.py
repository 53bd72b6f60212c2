"""AIPerf transport `telefuser_stream`: one AIPerf request = one world-model stream session of `telefuser serve-stream`.

    POST {url}/v1/stream/sessions              body from the telefuser_stream endpoint (prompt, image, config)
    GET  .../{id}/events[?frames=1][&status=1] SSE; every event is stamped on arrival (time.perf_counter_ns)
    POST .../{id}/control {"keys"}             the control trace, at delay_s after the first chunk or after chunk k
    POST .../{id}/ack {"published_frames"}     lossless mode: the frames the client counted, after `done`
    DELETE .../{id}                            at the end (a no-op for a finished session; frees the slot on errors)

The record's responses are, in order: the create answer (TextResponse), one SSEMessage per SSE event except
keep-alive comments (chunk events become the streamed content: TTFT = first chunk, inter-chunk latency = chunk gaps),
and a final TextResponse with content type `application/vnd.telefuser.harness+json` (controls sent and answered, the
ack answer, problems). The request ends (end_perf_ns) when `done` arrives. It fails with an AIPerf error
(`LosslessCheckError`) when the session broke a lossless criterion (lossless.py), or (`StreamSessionError`) when it
could not be created or the stream ended early. With `frames_in_events`, the base64 images of each chunk are counted
and replaced by their sizes before the event is stored, to keep the raw export small.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
from aiperf.common.hooks import on_init, on_stop
from aiperf.common.models import (
    ErrorDetails,
    RequestInfo,
    RequestRecord,
    SSEField,
    SSEMessage,
    TextResponse,
)
from aiperf.common.redact import redact_headers
from aiperf.plugin import plugins
from aiperf.transports.base_transports import BaseTransport, FirstTokenCallback, TransportMetadata

from .control_schedule import ControlSchedule
from .runner import REPO_ROOT
from .session import StreamSession, split_options
from .sse import SSEEvent, SSEParser

HARNESS_CONTENT_TYPE = "application/vnd.telefuser.harness+json"
_now = time.perf_counter_ns


def _slim_chunk(event: SSEEvent) -> SSEEvent:
    """Replace the base64 images of a chunk event (frames=1) by their decoded sizes."""
    data = event.json()
    images = data.pop("images", None)
    if not isinstance(images, list):
        return event
    data["image_bytes"] = [len(base64.b64decode(b)) if isinstance(b, str) else 0 for b in images]
    text = json.dumps(data, separators=(",", ":"))
    fields = [(n, text if n == "data" else v) for n, v in event.fields]
    return SSEEvent(
        perf_ns=event.perf_ns, event=event.event, data=text, id=event.id, comment=event.comment, fields=fields
    )


def _message(event: SSEEvent) -> SSEMessage:
    return SSEMessage(perf_ns=event.perf_ns, packets=[SSEField(name=n, value=v) for n, v in event.fields])


async def _read_json(response: aiohttp.ClientResponse) -> tuple[Any, str]:
    text = await response.text()
    try:
        return json.loads(text), text
    except json.JSONDecodeError:
        return None, text


class TeleFuserStreamTransport(BaseTransport):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._connector: aiohttp.TCPConnector | None = None

    @on_init
    async def _open(self) -> None:
        self._connector = aiohttp.TCPConnector(limit=0, force_close=False)

    @on_stop
    async def _close(self) -> None:
        connector, self._connector = self._connector, None
        if connector is not None:
            await connector.close()

    @classmethod
    def metadata(cls) -> TransportMetadata:
        # No URL schemes: never picked by auto-detection; select it with --transport telefuser_stream.
        return TransportMetadata(transport_type="telefuser_stream", url_schemes=[])

    def get_transport_headers(self, request_info: RequestInfo) -> dict[str, str]:
        return {"Content-Type": "application/json", "Accept": "application/json"}

    def get_url(self, request_info: RequestInfo) -> str:
        endpoint = request_info.model_endpoint.endpoint
        base = endpoint.get_url(request_info.url_index)
        if "://" not in base:
            base = f"http://{base}"
        split = urlsplit(base)
        if endpoint.custom_endpoint is not None:
            path = endpoint.custom_endpoint
        else:
            path = plugins.get_endpoint_metadata(endpoint.type).endpoint_path or ""
        base_path = split.path.rstrip("/")
        path = "/" + path.lstrip("/") if path else ""
        if path and base_path.endswith(path):
            path = ""
        return urlunsplit((split.scheme, split.netloc, base_path + path, split.query, split.fragment))

    async def send_request(
        self,
        request_info: RequestInfo,
        payload: dict[str, Any] | bytes,
        *,
        first_token_callback: FirstTokenCallback | None = None,
    ) -> RequestRecord:
        start_ns, wall_ns = _now(), time.time_ns()
        headers = self.build_headers(request_info)
        record = RequestRecord(request_headers=redact_headers(headers), start_perf_ns=start_ns, timestamp_ns=wall_ns)
        try:
            turn_extra = request_info.turns[-1].extra_body if request_info.turns else None
            options = split_options(request_info.model_endpoint.endpoint.extra, turn_extra, base_dir=REPO_ROOT)
            body = payload if isinstance(payload, (bytes, bytearray)) else orjson.dumps(payload)
        except Exception as exc:  # bad options: fail this request with the message
            record.end_perf_ns = _now()
            record.error = ErrorDetails.from_exception(exc)
            return record
        run = _SessionRun(self, request_info, options, record, headers, first_token_callback)
        timeout = request_info.model_endpoint.endpoint.timeout
        try:
            async with asyncio.timeout(timeout):
                await run.run(bytes(body))
        except TimeoutError:
            run.failed(f"the session did not finish within the request timeout ({timeout:g} s)")
        except asyncio.CancelledError:
            await asyncio.shield(run.cleanup(force_delete=True, close=True))
            raise
        except Exception as exc:  # connection refused, reset, ...: an error record, never an exception
            run.failed(f"the session failed: {exc!r}")
        await run.finish()
        return record


class _SessionRun:
    def __init__(self, transport, request_info, options, record, headers, first_token_callback):
        self.transport = transport
        self.request_info = request_info
        self.options = options
        self.record = record
        self.headers = headers
        self.first_token_callback = first_token_callback
        self.state = StreamSession(options, record.start_perf_ns)
        self.create_url = transport.build_url(request_info)
        self.session_url: str | None = None
        self.http: aiohttp.ClientSession | None = None
        self.controls = ControlSchedule(self.state, self._send_control)
        self.create_failed: ErrorDetails | None = None
        self.deleted = False

    def failed(self, message: str) -> None:
        if self.state.session_id is None and self.create_failed is None:
            self.create_failed = ErrorDetails(type="StreamSessionError", message=f"POST {self.create_url}: {message}")
        else:
            self.state.stream_ended(message)

    def _client(self) -> aiohttp.ClientSession:
        if self.http is None:
            self.http = aiohttp.ClientSession(
                connector=self.transport._connector,
                connector_owner=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            )
        return self.http

    async def run(self, body: bytes) -> None:
        http = self._client()
        async with http.post(self.create_url, data=body, headers=self.headers) as response:
            answer, text = await _read_json(response)
            self.record.status = response.status
            self.record.responses.append(
                TextResponse(perf_ns=_now(), text=text, content_type=response.content_type or "application/json")
            )
        if not 200 <= response.status < 300:
            self.create_failed = ErrorDetails(
                code=response.status,
                type="StreamSessionError",
                message=f"POST {self.create_url} answered {response.status}: {text[:500]}",
            )
            return
        self.state.created(answer)
        base = urlunsplit(urlsplit(self.create_url)._replace(query="", fragment=""))
        self.session_url = f"{base.rstrip('/')}/{self.state.session_id}"
        await self._stream()

    async def _stream(self) -> None:
        http = self._client()
        stall = float(self.options.harness["stall_timeout_s"])
        url = f"{self.session_url}/events{self.options.events_query()}"
        sse_headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-type", "accept")}
        sse_headers["Accept"] = "text/event-stream"
        self.controls.start()
        parser = SSEParser()
        try:
            async with http.get(
                url, headers=sse_headers, timeout=aiohttp.ClientTimeout(total=None, sock_read=stall)
            ) as r:
                if r.status != 200:
                    self.state.stream_ended(f"GET {url} answered {r.status}: {(await r.text())[:300]}")
                    return
                self.record.recv_start_perf_ns = _now()
                async for piece in r.content.iter_any():
                    if self._handle(parser.feed(piece, _now())):
                        return
                self._handle(parser.close(_now()))
                self.state.stream_ended("the event stream ended before the done event")
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.state.stream_ended(f"the event stream failed: {exc!r} (stall timeout {stall:g} s)")
        finally:
            self.controls.close()

    def _handle(self, events: list[SSEEvent]) -> bool:
        """Returns True when the stream is over (done, fatal error, closed)."""
        for event in events:
            if event.is_comment:
                continue
            try:
                if event.event == "chunk" and self.options.harness["frames_in_events"]:
                    event = _slim_chunk(event)
                kind = self.state.on_event(event)
            except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
                self.state.stream_ended(f"unreadable {event.event!r} event: {exc}")
                return True
            message = _message(event)
            self.record.responses.append(message)
            if kind == "chunk":
                if len(self.state.chunks) == 1 and self.first_token_callback is not None:
                    latency_ns = event.perf_ns - self.record.start_perf_ns
                    self.controls.add(asyncio.ensure_future(self.first_token_callback(latency_ns, message)))
                self.controls.on_chunk(self.state.chunks[-1].index)
            elif kind in ("done", "fatal", "closed"):
                self.record.end_perf_ns = event.perf_ns
                return True
        return False

    async def _send_control(self, step) -> None:
        result = self.state.control_sent(step, _now())
        try:
            async with self._client().post(
                f"{self.session_url}/control", json={"keys": list(step.keys)}, timeout=aiohttp.ClientTimeout(total=30)
            ) as r:
                result.answer, _ = await _read_json(r)
                result.status, result.answered_ns = r.status, _now()
        except (aiohttp.ClientError, TimeoutError) as exc:
            result.answer, result.answered_ns = repr(exc), _now()

    async def finish(self) -> None:
        """After the stream: settle controls, ack (lossless), clean up, judge and write the harness report."""
        record, state = self.record, self.state
        if record.end_perf_ns is None:
            record.end_perf_ns = _now()
        await self.controls.settle()
        lossless = self.options.harness["lossless"]
        if self.create_failed is None and lossless and state.done is not None:
            await self._ack()
        await self.cleanup(force_delete=False, close=False)
        if self.create_failed is not None:
            record.error = self.create_failed
        else:
            if lossless:
                problems = state.problems()
                kind = "LosslessCheckError" if state.end_reason is None else "StreamSessionError"
            else:
                problems = [p for p in (state.end_reason, None if state.chunks else "no chunk received") if p]
                kind = "StreamSessionError"
            if problems:
                record.error = ErrorDetails(code=None, type=kind, message="; ".join(problems))
        report = state.report()
        record.responses.append(
            TextResponse(
                perf_ns=_now(), text=json.dumps({"telefuser_harness": report}), content_type=HARNESS_CONTENT_TYPE
            )
        )
        await self.cleanup(force_delete=False, close=True)

    async def _ack(self) -> None:
        counted = self.state.counted_frames
        try:
            async with self._client().post(
                f"{self.session_url}/ack", json={"published_frames": counted}, timeout=aiohttp.ClientTimeout(total=30)
            ) as r:
                answer, _ = await _read_json(r)
                self.state.record_ack(answer if isinstance(answer, dict) else None, r.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.state.record_ack(None, None)
            self.state.ack_problems = [f"delivery ack failed: {exc!r}"]

    async def cleanup(self, *, force_delete: bool, close: bool) -> None:
        """DELETE the session when asked or when it did not end normally; then close the HTTP client if `close`."""
        wanted = force_delete or self.options.harness["delete_session"] or self.state.done is None
        if self.session_url is not None and not self.deleted and wanted:
            self.deleted = True
            with contextlib.suppress(Exception):
                async with self._client().delete(self.session_url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                    await r.read()
        if close and self.http is not None:
            http, self.http = self.http, None
            await http.close()
