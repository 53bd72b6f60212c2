"""`/v1/stream/sessions`: create, list, read and delete sessions; steer, stop and acknowledge one; its WebSocket, its
event stream and its WebRTC offer (PROTOCOL.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ...common.http_errors import RequestError
from ...common.request_body import json_object, read_body
from ..client_messages import MAX_COUNT
from ..contract import check_client_keys
from ..request import parse_create_request
from ..service import Service
from ..session import StateError
from ..sse_consumer import sse_stream
from ..ws_consumer import serve_websocket

SMALL_BODY_BYTES = 64 << 10  # control / ack bodies
router = APIRouter()


async def _json_body(request: Request) -> dict[str, Any]:
    body = await read_body(request, SMALL_BODY_BYTES)
    return json_object(body, '{"keys": ["W"]}') if body.strip() else {}


@router.post("/v1/stream/sessions", status_code=201)
async def create_session(request: Request, service: Service) -> JSONResponse:
    registry, settings = service.registry, service.registry.settings
    body = await read_body(request, settings.max_body_bytes)
    image_pixels = registry.limits["max_image_pixels"]
    content_type = request.headers.get("content-type", "")
    parsed = await run_in_threadpool(parse_create_request, content_type, body, image_pixels, service.config_keys)
    state = await registry.create(parsed)
    return JSONResponse(
        {
            "session_id": state.id,
            **service.urls(request, state),
            "total_chunks": state.total_chunks,
            "total_frames": state.total_frames,
            "fps": state.fps,
            "resolution": state.resolution,
            "config": state.config,
            "codec": state.codec,
            "delivery_mode": settings.delivery_mode,
            "buffer_chunks": settings.buffer_chunks,
            "keys": list(settings.keys),
            **({"webrtc": {"ice_servers": list(service.webrtc.ice_servers)}} if service.webrtc else {}),
        },
        status_code=201,
    )


@router.get("/v1/stream/sessions")
async def list_sessions(service: Service) -> dict[str, Any]:
    live = [s.describe() for s in service.registry.live.values()]
    finished = [s.describe() for s in reversed(service.registry.finished.values())]
    return {"object": "list", "data": live + finished, "live": len(live), "finished": len(finished)}


@router.get("/v1/stream/sessions/{session_id}")
async def session_status(session_id: str, service: Service) -> dict[str, Any]:
    return service.lookup(session_id, live_only=False).describe()


@router.delete("/v1/stream/sessions/{session_id}", status_code=204)
async def delete_session(session_id: str, service: Service) -> Response:
    if session_id in service.registry.finished:
        return Response(status_code=204)  # already ended: the slot is free, which is what DELETE asks
    state = service.lookup(session_id)
    await asyncio.shield(service.registry.spawn(state.aclose("deleted")))
    return Response(status_code=204)


@router.post("/v1/stream/sessions/{session_id}/control")
async def control(session_id: str, request: Request, service: Service) -> dict[str, Any]:
    state = service.lookup(session_id)
    try:
        message = await _json_body(request)
        keys = check_client_keys(message.get("keys"), service.registry.settings.keys)
        seq = message.get("seq")
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_COUNT):
            raise ValueError(f"'seq' must be an integer in [0, 2**53), got {repr(seq)[:40]}")
        return state.set_controls(keys, seq)
    except ValueError as exc:
        state.metrics.inc("control_errors_total")
        raise RequestError(422, f"control rejected: {exc}") from None
    except StateError as exc:
        raise RequestError(409, str(exc)) from None


@router.post("/v1/stream/sessions/{session_id}/stop", status_code=202)
async def stop(session_id: str, service: Service) -> dict[str, Any]:
    service.lookup(session_id).request_stop()
    return {"stopping": True}


@router.post("/v1/stream/sessions/{session_id}/ack")
async def ack(session_id: str, request: Request, service: Service) -> dict[str, Any]:
    state = service.lookup(session_id, live_only=False)
    frames = (await _json_body(request)).get("published_frames")
    if not isinstance(frames, int) or isinstance(frames, bool) or frames < 0:
        raise RequestError(422, f"'published_frames' must be a non-negative integer, got {frames!r}")
    try:
        state.record_ack(frames)
    except StateError as exc:
        raise RequestError(409, str(exc)) from None
    return state.ack_payload()


@router.websocket("/v1/stream/sessions/{session_id}/ws")
async def websocket_stream(websocket: WebSocket, session_id: str, service: Service) -> None:
    await serve_websocket(websocket, service.registry, session_id)


@router.post("/v1/stream/sessions/{session_id}/webrtc")
async def webrtc_offer(session_id: str, request: Request, service: Service) -> dict[str, str]:
    """The browser's SDP offer -> the answer; the session then streams over that peer connection."""
    if service.webrtc is None:
        raise RequestError(404, "WebRTC delivery is off on this server (start it with serve-stream --webrtc)")
    state = service.lookup(session_id)
    offer = json_object(await read_body(request, SMALL_BODY_BYTES), '{"type": "offer", "sdp": "v=0..."}')
    if offer.get("type") != "offer" or not isinstance(offer.get("sdp"), str):
        raise RequestError(422, 'the body must be {"type": "offer", "sdp": <the SDP text>}')
    if state.consumer is not None or state.closed:
        raise RequestError(409, f"session {session_id} already has a consumer or is closed; one stream per session")
    from ..webrtc.peer import OfferError, PeerSession

    peer = PeerSession(state, service.registry, service.webrtc)
    try:
        answer = await peer.answer(offer["sdp"])
        state.attach("webrtc", images=False, pixels=True)
    except (OfferError, StateError) as exc:
        await peer.close()
        raise RequestError(409 if isinstance(exc, StateError) else 422, str(exc)) from None
    except BaseException:
        await peer.close()
        raise
    service.registry.spawn(peer.run())
    return answer


@router.get("/v1/stream/sessions/{session_id}/events")
async def events(session_id: str, service: Service, frames: int = 0, status: int = 0) -> StreamingResponse:
    state = service.lookup(session_id)
    try:
        state.attach("sse", images=bool(frames))
    except StateError as exc:
        raise RequestError(409, str(exc)) from None
    return StreamingResponse(
        sse_stream(
            state,
            service.registry,
            frames=bool(frames),
            status=bool(status),
            keepalive_s=service.registry.settings.keepalive_s,
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
