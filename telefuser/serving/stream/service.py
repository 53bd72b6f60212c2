"""What the stream service's routes share: one `StreamService` on `app.state.service`, reached through a dependency.

The routes (routes/) hold no state of their own: the sessions are in the `SessionRegistry`; the API keys, this
replica's identity, the model's key bindings and the models the CLI can serve are beside it here.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from .contract import COMMON_CONFIG_KEYS
from ..common.auth import ApiKeys
from ..common.http_errors import RequestError
from .registry import SessionRegistry
from .replica import ReplicaIdentity
from .session import StreamSessionState
from .webrtc.settings import WebRtcSettings

_STREAM_PATH = re.compile(r"^/v1/stream/sessions/([^/]+)/(ws|events|webrtc)$")


@dataclass
class StreamService:
    registry: SessionRegistry
    keys: ApiKeys
    replica: ReplicaIdentity
    bindings: dict[str, str]  # the model's {key: action} controls
    config_keys: tuple[str, ...] = COMMON_CONFIG_KEYS  # the request config keys the model takes (contract.config_keys)
    models: Sequence[str] = ()  # the models this service's CLI can serve (/v1/service/metadata)
    webrtc: WebRtcSettings | None = None  # None: WebRTC delivery is off (serve-stream without --webrtc)

    def lookup(self, session_id: str, *, live_only: bool = True) -> StreamSessionState:
        state = self.registry.live.get(session_id) if live_only else self.registry.get(session_id)
        if state is None:
            raise RequestError(404, f"unknown or closed session {session_id!r}")
        return state

    def stream_token_ok(self, path: str, token: str) -> bool:
        """A session's WebSocket, event stream and WebRTC offer also take that session's own token in the query (a
        browser cannot set headers on the first two)."""
        match = _STREAM_PATH.match(path)
        if match is None:
            return False
        if self.keys.matches(token):
            return True
        state = self.registry.get(match.group(1))
        expected = state.stream_token if state is not None else None
        return expected is not None and hmac.compare_digest(expected.encode(), token.encode("utf-8", "surrogatepass"))

    def urls(self, request: Request, state: StreamSessionState) -> dict[str, str]:
        """Reply URLs: from --public-url when set (the proxy's address for this replica), else from the request."""
        base = self.replica.base_url or str(request.base_url).rstrip("/")
        ws_base = ("wss" + base[5:]) if base.startswith("https") else ("ws" + base[4:])
        prefix = urlsplit(base).path.rstrip("/")  # "/r/<replica>" behind the shipped proxy, else ""
        path = f"/v1/stream/sessions/{state.id}"
        query = f"?token={state.stream_token}" if self.keys.enabled else ""
        urls = {
            "ws_url": f"{ws_base}{path}/ws{query}",
            "sse_url": f"{base}{path}/events{query}",
            "ws_path": f"{prefix}{path}/ws{query}",
            "sse_path": f"{prefix}{path}/events{query}",
        }
        if self.webrtc is not None:
            urls |= {"webrtc_url": f"{base}{path}/webrtc{query}", "webrtc_path": f"{prefix}{path}/webrtc{query}"}
        return urls


def stream_service(connection: HTTPConnection) -> StreamService:
    return connection.app.state.service


# A route parameter typed `Service` receives the app's `StreamService`; it adds nothing to the OpenAPI schema.
Service = Annotated[StreamService, Depends(stream_service)]
