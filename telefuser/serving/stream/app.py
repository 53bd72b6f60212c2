"""The streaming service as a FastAPI app: HTTP session API, per-session WebSocket and SSE, metrics, web page.

The routes, their answers and who may call them are in PROTOCOL.md; they live in routes/ as routers and share one
`StreamService` (service.py) on `app.state.service`. All session state lives in its `SessionRegistry`, whose drain
is `app.state.drain_on_shutdown`: the server awaits it before it closes connections (common/uvicorn_server.py). The
lifespan starts the registry's reaper and closes every session on shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from ..common.auth import ApiKeys
from ..common.service_app import new_service_app
from .contract import SessionFactory, config_keys, key_bindings
from .envelope import CODECS
from .limits import StreamLimitFlags, derive_stream_limits
from .metrics import StreamMetrics
from .registry import SessionRegistry
from .replica import ReplicaIdentity, ReplicaRouting
from .routes import page, sessions
from .routes import service as service_routes
from .service import StreamService
from .settings import StreamSettings
from .webrtc.settings import WebRtcSettings

log = logging.getLogger("telefuser.serving")


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
    models: Sequence[str] = (),
    webrtc: WebRtcSettings | None = None,
) -> FastAPI:
    """`factory` opens the model's sessions (see contract.py). `models`: the models the CLI can serve, listed by
    /v1/service/metadata. `webrtc`: offer WebRTC delivery (needs aiortc) beside the WebSocket and SSE."""
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
    service = StreamService(
        registry=SessionRegistry(factory, settings, StreamMetrics(), limit_set, new_id=identity.new_session_id),
        keys=api_keys or ApiKeys(),
        replica=identity,
        bindings=bindings,
        config_keys=config_keys(getattr(factory, "metadata", None)),
        models=tuple(models),
        webrtc=webrtc,
    )

    app = new_service_app(
        "TeleFuser stream service",
        service,
        lifespan=_lifespan,
        public=_public,
        query_token_ok=service.stream_token_ok,
        inner_middleware=((ReplicaRouting, {"identity": identity}),),  # a 421 for another replica's session first
    )
    app.state.drain_on_shutdown = service.registry.drain_for_shutdown
    app.include_router(service_routes.router)
    app.include_router(sessions.router)
    app.mount("/static", StaticFiles(directory=page.STATIC_DIR), name="static")
    app.include_router(page.router)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI):
    registry: SessionRegistry = app.state.service.registry
    await registry.start()
    try:
        yield
    finally:
        closed = await registry.shutdown()
        log.info("stream service stopped: closed %d session(s)", closed)
