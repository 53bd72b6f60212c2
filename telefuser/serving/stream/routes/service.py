"""What the stream service says about itself: `/v1/service/{health,capacity,metadata,metrics}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from ..client_messages import BURST, MAX_MESSAGE_BYTES, RATE
from ..envelope import CODECS
from ..metrics import CONTENT_TYPE
from ..service import Service

router = APIRouter()


@router.get("/v1/service/health")
async def health(service: Service) -> JSONResponse:
    registry = service.registry
    body = {
        "status": "shutting_down" if registry.shutting_down else "ok",
        **registry.describe(),
        "delivery_mode": registry.settings.delivery_mode,
    }
    return JSONResponse(body, status_code=503 if registry.shutting_down else 200)


@router.get("/v1/service/capacity")
async def capacity(service: Service) -> JSONResponse:
    """200 while a session slot is free, else 503: what a stock proxy's health check needs to place a new
    session on a replica that can take it."""
    registry, settings = service.registry, service.registry.settings
    free = 0 if registry.shutting_down else max(0, settings.max_sessions - registry.slots_in_use)
    body = {"free": free, "max_sessions": settings.max_sessions, "replica": service.replica.replica_id}
    if free:
        return JSONResponse(body)
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})


@router.get("/v1/service/metadata")
async def metadata(service: Service) -> dict[str, Any]:
    registry, settings = service.registry, service.registry.settings
    return {
        "service": "telefuser-stream",
        "model": getattr(registry.factory, "metadata", {}),
        "models": list(service.models),
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
        "auth": {"api_key_required": service.keys.enabled, "scheme": "Bearer", "stream_query_token": True},
        "keys": {"allowed": list(settings.keys), "bindings": service.bindings},
        "config_keys": list(service.config_keys),
        "codecs": list(CODECS),
        "default_codec": settings.codec,
        "webrtc": service.webrtc.describe() if service.webrtc else {"enabled": False},
        "envelope": "TFCH v1: magic, uint32 BE header length, JSON header, frames (see /static/ws_player.js)",
    }


@router.get("/v1/service/metrics")
async def metrics(service: Service) -> PlainTextResponse:
    registry, settings = service.registry, service.registry.settings
    live = list(registry.live.values())
    depths = [s.fifo.qsize() for s in live]
    gauges = [
        ("sessions_active", "Sessions registered (created and not closed).", len(live), {}),
        ("sessions_in_use", "Model session slots in use (including creates in progress).", registry.slots_in_use, {}),
        ("sessions_streaming", "Sessions with an attached consumer.", sum(s.state == "streaming" for s in live), {}),
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
