"""The streaming service as a FastAPI app: HTTP session API, per-session WebSocket and SSE, metrics, web page.

The routes, their answers and who may call them are in PROTOCOL.md. All state lives in the `SessionRegistry` on
`app.state.stream`; the lifespan starts its reaper and closes every session on shutdown.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from ..common.auth import ApiKeyMiddleware, ApiKeys
from ..common.http_errors import RequestError, ServerFaultMiddleware, error_response
from ..common.request_body import json_object, read_body
from .client_messages import BURST, MAX_MESSAGE_BYTES, RATE
from .contract import CONFIG_KEYS, SessionFactory, key_bindings, normalize_keys
from .envelope import CODECS
from .limits import StreamLimitFlags, derive_stream_limits
from .metrics import CONTENT_TYPE, StreamMetrics
from .registry import SessionRegistry
from .replica import ReplicaIdentity, ReplicaRouting
from .request import parse_create_request
from .session import SessionRuntime, StateError, StreamSettings
from .sse_consumer import sse_stream
from .ws_consumer import serve_websocket

log = logging.getLogger("telefuser.serving")
STATIC_DIR = Path(__file__).with_name("static")
SMALL_BODY_BYTES = 64 << 10  # control / ack bodies
_STREAM_PATH = re.compile(r"^/v1/stream/sessions/([^/]+)/(ws|events)$")


def _public(path: str) -> bool:
    """No key needed: health, capacity (what a proxy's check reads), and the web page with its static files (they
    hold no data and start no work)."""
    return path in ("/v1/service/health", "/v1/service/capacity", "/") or path.startswith("/static/")


def create_stream_app(
    factory: SessionFactory,
    *,
    max_sessions: int = 1,
    delivery_mode: str = "lossless",
    buffer_chunks: int = 4,
    codec: str = "jpeg",
    jpeg_quality: int = 85,
    ack_timeout_s: float = 10.0,
    idle_timeout_s: float = 120.0,
    keepalive_s: float = 15.0,
    max_body_bytes: int = 32 << 20,
    limits: StreamLimitFlags | None = None,
    api_keys: ApiKeys | None = None,
    replica: ReplicaIdentity | None = None,
) -> FastAPI:
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    limit_set = derive_stream_limits(factory, max_sessions=max_sessions, max_body_bytes=max_body_bytes, flags=limits)
    bindings = key_bindings(getattr(factory, "metadata", None))
    settings = StreamSettings(
        max_sessions=max_sessions,
        delivery_mode=delivery_mode,
        buffer_chunks=buffer_chunks,
        codec=codec,
        jpeg_quality=jpeg_quality,
        ack_timeout_s=ack_timeout_s,
        idle_timeout_s=idle_timeout_s,
        keepalive_s=keepalive_s,
        max_body_bytes=max_body_bytes,
        max_frames=limit_set.value("max_frames"),
        keys=tuple(bindings),
    )
    identity = replica or ReplicaIdentity()
    registry = SessionRegistry(factory, settings, StreamMetrics(), limit_set, new_id=identity.new_session_id)
    keys = api_keys or ApiKeys()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await registry.start()
        try:
            yield
        finally:
            closed = await registry.shutdown()
            log.info("stream service stopped: closed %d session(s)", closed)

    # No /docs: Swagger UI would load from a CDN, and the service must work offline.
    app = FastAPI(title="TeleFuser stream service", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.stream = registry
    app.state.api_keys = keys
    app.state.replica = identity

    def stream_token_ok(path: str, token: str) -> bool:
        match = _STREAM_PATH.match(path)
        if match is None:
            return False
        if keys.matches(token):
            return True
        runtime = registry.get(match.group(1))
        expected = runtime.stream_token if runtime is not None else None
        return expected is not None and hmac.compare_digest(expected.encode(), token.encode("utf-8", "surrogatepass"))

    app.add_middleware(ApiKeyMiddleware, keys=keys, public=_public, query_token_ok=stream_token_ok)
    app.add_middleware(ReplicaRouting, identity=identity)  # a 421 for another replica's session, before the key
    app.add_middleware(ServerFaultMiddleware, logger=log)  # outermost: request ids, and a 401 gets one too
    _add_service_routes(app, registry, bindings)
    _add_session_routes(app, registry)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    return app


def _add_service_routes(app: FastAPI, registry: SessionRegistry, bindings: dict[str, str]) -> None:
    settings = registry.settings

    @app.get("/v1/service/health")
    async def health() -> JSONResponse:
        body = {
            "status": "shutting_down" if registry.shutting_down else "ok",
            **registry.describe(),
            "delivery_mode": settings.delivery_mode,
        }
        return JSONResponse(body, status_code=503 if registry.shutting_down else 200)

    @app.get("/v1/service/capacity")
    async def capacity(request: Request) -> JSONResponse:
        """200 while a session slot is free, else 503: what a stock proxy's health check needs to place a new
        session on a replica that can take it."""
        free = 0 if registry.shutting_down else max(0, settings.max_sessions - registry.slots_in_use)
        body = {"free": free, "max_sessions": settings.max_sessions, "replica": request.app.state.replica.replica_id}
        if free:
            return JSONResponse(body)
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})

    @app.get("/v1/service/metadata")
    async def metadata(request: Request) -> dict[str, Any]:
        return {
            "service": "telefuser-stream",
            "model": getattr(registry.factory, "metadata", {}),
            "limits": {
                "max_sessions": settings.max_sessions,
                "buffer_chunks": settings.buffer_chunks,
                "delivery_mode": settings.delivery_mode,
                "ack_timeout_s": settings.ack_timeout_s,
                "idle_timeout_s": settings.idle_timeout_s,
                **registry.limits.values(),
                "ws_message_bytes": MAX_MESSAGE_BYTES,
                "ws_messages_per_s": RATE,
                "ws_message_burst": BURST,
                "max_notices": settings.max_notices,
            },
            "limit_sources": registry.limits.sources(),
            "auth": {
                "api_key_required": request.app.state.api_keys.enabled,
                "scheme": "Bearer",
                "stream_query_token": True,
            },
            "keys": {"allowed": list(settings.keys), "bindings": bindings},
            "config_keys": list(CONFIG_KEYS),
            "codecs": list(CODECS),
            "default_codec": settings.codec,
            "envelope": "TFCH v1: magic, uint32 BE header length, JSON header, frames (see /static/app.js)",
        }

    @app.get("/v1/service/metrics")
    async def metrics() -> PlainTextResponse:
        live = list(registry.live.values())
        depths = [s.fifo.qsize() for s in live]
        gauges = [
            ("sessions_active", "Sessions registered (created and not closed).", len(live), {}),
            (
                "sessions_in_use",
                "Model session slots in use (including creates in progress).",
                registry.slots_in_use,
                {},
            ),
            (
                "sessions_streaming",
                "Sessions with an attached consumer.",
                sum(s.state == "streaming" for s in live),
                {},
            ),
            ("sessions_max", "Configured max_sessions.", settings.max_sessions, {}),
            ("queue_depth_chunks", "Chunks queued for delivery, summed over sessions.", sum(depths), {}),
            ("queue_depth_max_chunks", "Deepest per-session delivery queue.", max(depths, default=0), {}),
            (
                "queue_capacity_chunks",
                "Per-session delivery queue capacity (buffer_chunks).",
                settings.buffer_chunks,
                {},
            ),
            ("info", "Service configuration.", 1, {"delivery_mode": settings.delivery_mode, "codec": settings.codec}),
        ]
        return PlainTextResponse(registry.metrics.render(gauges), media_type=CONTENT_TYPE)


def _add_session_routes(app: FastAPI, registry: SessionRegistry) -> None:
    settings = registry.settings

    def lookup(session_id: str, *, live_only: bool = True) -> SessionRuntime:
        runtime = registry.live.get(session_id) if live_only else registry.get(session_id)
        if runtime is None:
            raise RequestError(404, f"unknown or closed session {session_id!r}")
        return runtime

    async def json_body(request: Request) -> dict[str, Any]:
        body = await read_body(request, SMALL_BODY_BYTES)
        return json_object(body, '{"keys": ["W"]}') if body.strip() else {}

    @app.exception_handler(RequestError)
    async def request_error(_request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.detail, headers=exc.headers)

    def urls(request: Request, runtime: SessionRuntime) -> dict[str, str]:
        """Reply URLs: from --public-url when set (the proxy's address for this replica), else from the request."""
        base = request.app.state.replica.base_url or str(request.base_url).rstrip("/")
        ws_base = ("wss" + base[5:]) if base.startswith("https") else ("ws" + base[4:])
        prefix = urlsplit(base).path.rstrip("/")  # "/r/<replica>" behind the shipped proxy, else ""
        path = f"/v1/stream/sessions/{runtime.id}"
        query = f"?token={runtime.stream_token}" if request.app.state.api_keys.enabled else ""
        return {
            "ws_url": f"{ws_base}{path}/ws{query}",
            "sse_url": f"{base}{path}/events{query}",
            "ws_path": f"{prefix}{path}/ws{query}",
            "sse_path": f"{prefix}{path}/events{query}",
        }

    @app.post("/v1/stream/sessions", status_code=201)
    async def create_session(request: Request) -> JSONResponse:
        body = await read_body(request, settings.max_body_bytes)
        image_pixels = registry.limits["max_image_pixels"]
        parsed = await run_in_threadpool(
            parse_create_request, request.headers.get("content-type", ""), body, image_pixels
        )
        runtime = await registry.create(parsed)
        return JSONResponse(
            {
                "session_id": runtime.id,
                **urls(request, runtime),
                "total_chunks": runtime.total_chunks,
                "total_frames": runtime.total_frames,
                "fps": runtime.fps,
                "resolution": runtime.resolution,
                "config": runtime.config,
                "codec": runtime.codec,
                "delivery_mode": settings.delivery_mode,
                "buffer_chunks": settings.buffer_chunks,
                "keys": list(settings.keys),
            },
            status_code=201,
        )

    @app.get("/v1/stream/sessions")
    async def list_sessions() -> dict[str, Any]:
        live = [s.describe() for s in registry.live.values()]
        finished = [s.describe() for s in reversed(registry.finished.values())]
        return {"object": "list", "data": live + finished, "live": len(live), "finished": len(finished)}

    @app.get("/v1/stream/sessions/{session_id}")
    async def session_status(session_id: str) -> dict[str, Any]:
        return lookup(session_id, live_only=False).describe()

    @app.delete("/v1/stream/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str) -> Response:
        if session_id in registry.finished:
            return Response(status_code=204)  # already ended: the slot is free, which is what DELETE asks
        runtime = lookup(session_id)
        await asyncio.shield(registry.spawn(runtime.aclose("deleted")))
        return Response(status_code=204)

    @app.post("/v1/stream/sessions/{session_id}/control")
    async def control(session_id: str, request: Request) -> dict[str, Any]:
        runtime = lookup(session_id)
        try:
            keys = normalize_keys((await json_body(request)).get("keys"), settings.keys)
            return {"keys": keys, "applies_from_chunk": runtime.set_controls(keys)}
        except ValueError as exc:
            runtime.metrics.inc("control_errors_total")
            raise RequestError(422, f"control rejected: {exc}") from None
        except StateError as exc:
            raise RequestError(409, str(exc)) from None

    @app.post("/v1/stream/sessions/{session_id}/stop", status_code=202)
    async def stop(session_id: str) -> dict[str, Any]:
        lookup(session_id).request_stop()
        return {"stopping": True}

    @app.post("/v1/stream/sessions/{session_id}/ack")
    async def ack(session_id: str, request: Request) -> dict[str, Any]:
        runtime = lookup(session_id, live_only=False)
        frames = (await json_body(request)).get("published_frames")
        if not isinstance(frames, int) or isinstance(frames, bool) or frames < 0:
            raise RequestError(422, f"'published_frames' must be a non-negative integer, got {frames!r}")
        try:
            runtime.record_ack(frames)
        except StateError as exc:
            raise RequestError(409, str(exc)) from None
        return runtime.ack_payload()

    @app.websocket("/v1/stream/sessions/{session_id}/ws")
    async def websocket_stream(websocket: WebSocket, session_id: str) -> None:
        await serve_websocket(websocket, registry, session_id)

    @app.get("/v1/stream/sessions/{session_id}/events")
    async def events(session_id: str, frames: int = 0, status: int = 0) -> StreamingResponse:
        runtime = lookup(session_id)
        try:
            runtime.attach("sse", images=bool(frames))
        except StateError as exc:
            raise RequestError(409, str(exc)) from None
        return StreamingResponse(
            sse_stream(runtime, registry, frames=bool(frames), status=bool(status), keepalive_s=settings.keepalive_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
