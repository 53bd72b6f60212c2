"""The Server-Sent Events consumer of a session, for tools such as an AIPerf plugin.

One `event: chunk` per chunk (its frames in base64 with `frames=1`), then `event: done`; keep-alive comments keep
proxies from timing out. The events are in PROTOCOL.md.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from .registry import SessionRegistry
from .events import KEEPALIVE, ChunkItem, DoneItem, Notice
from .session import StreamSessionState


def sse_event(event: str, data: dict[str, Any], event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def sse_stream(
    state: StreamSessionState, registry: SessionRegistry, *, frames: bool, status: bool, keepalive_s: float
) -> AsyncIterator[str]:
    finished = False
    registry.consumers += 1
    try:
        yield f": telefuser stream session={state.id}\n\n"
        if status:
            yield sse_event("status", state.ready_payload())
        async with contextlib.aclosing(state.events(keepalive_s)) as events:
            async for event in events:
                if event is KEEPALIVE:
                    yield ": keep-alive\n\n"
                elif isinstance(event, ChunkItem):
                    images = event.images or []
                    data = {"type": "chunk", **state.mark_sent(event, sum(map(len, images)))}
                    if frames:
                        data["codec"] = event.codec
                        data["images"] = [base64.b64encode(b).decode("ascii") for b in images]
                    yield sse_event("chunk", data, event.index)
                elif isinstance(event, DoneItem):
                    finished = True
                    yield sse_event("done", {**state.done_payload(event), "type": "done"})
                elif isinstance(event, Notice):
                    stage = event.payload.get("stage")
                    if stage in ("error", "closed"):
                        yield sse_event(stage, {**event.payload, "type": stage})
                    elif status:
                        yield sse_event("status", event.payload)
    finally:
        # May run inside a cancelled scope (client gone): no awaits here, hand the teardown to a task.
        registry.consumers -= 1
        registry.spawn(state.finish_after_ack() if finished else state.aclose("disconnect"))
