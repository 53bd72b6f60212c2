"""The WebSocket consumer of a session: binary chunk envelopes + JSON status events out, client messages in.

Per chunk the client receives the binary envelope (see envelope.py) and then a `chunk_sent` status event. A reader
task runs beside the sender; when the client disconnects it closes the session at once, which stops generation and
frees the slot even while the sender is waiting for the next chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import WebSocket

from ..common.http_errors import request_id_of
from .client_messages import MessageBudget, receive_client_message
from .registry import SessionRegistry
from .events import ChunkItem, DoneItem, Notice
from .session import StreamSessionState, StateError

log = logging.getLogger("telefuser.serving")
CLOSE_CODES = {"completed": 1000, "stopped": 1000, "deleted": 1000, "idle": 1000, "shutdown": 1001, "error": 1011}


async def serve_websocket(websocket: WebSocket, registry: SessionRegistry, session_id: str) -> None:
    await websocket.accept()
    state = registry.live.get(session_id)
    if state is None:
        await _refuse(websocket, f"unknown or closed session {session_id!r}", 4404)
        return
    try:
        state.attach("websocket", images=True)
    except StateError as exc:
        await _refuse(websocket, str(exc), 4409)
        return
    reader = asyncio.create_task(_read(websocket, state, registry))
    reason = "disconnect"
    registry.consumers += 1
    try:
        await websocket.send_json(state.ready_payload())
        async with contextlib.aclosing(state.events()) as events:
            async for event in events:
                if isinstance(event, ChunkItem):
                    data = event.envelope(state.fps)
                    await websocket.send_bytes(data)
                    await websocket.send_json(
                        {"type": "status", "stage": "chunk_sent", **state.mark_sent(event, len(data))}
                    )
                elif isinstance(event, DoneItem):
                    await websocket.send_json(state.done_payload(event))
                    reason = "completed"
                elif isinstance(event, Notice):
                    await websocket.send_json(event.payload)
                    if event.final:
                        reason = event.payload.get("reason") or "error"
        if reason == "completed":
            await state.finish_after_ack()
            await websocket.send_json(state.ack_payload())
        await websocket.close(CLOSE_CODES.get(reason, 1000))
    except Exception as exc:  # the client went away mid-send: a disconnect, not a server error
        log.debug("session %s: websocket ended: %r", state.id, exc)
    finally:
        registry.consumers -= 1
        reader.cancel()
        registry.spawn(state.aclose(reason))


async def _read(websocket: WebSocket, state: StreamSessionState, registry: SessionRegistry) -> None:
    budget = MessageBudget()
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            try:
                receive_client_message(state, message, budget)
            except Exception:  # our fault, not the client's: log it, tell the client, keep streaming
                request_id = request_id_of(websocket.scope)
                log.exception("session %s: request %s: handling a client message failed", state.id, request_id)
                state.client_error(f"internal error handling that message (request id {request_id})")
    except Exception as exc:
        log.debug("session %s: websocket reader ended: %r", state.id, exc)
    finally:
        if not state.closed:
            registry.spawn(state.aclose("disconnect"))


async def _refuse(websocket: WebSocket, message: str, code: int) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_json({"type": "status", "stage": "error", "fatal": True, "message": message})
        await websocket.close(code=code, reason=message.encode()[:120].decode("utf-8", "ignore"))  # 123 bytes at most
