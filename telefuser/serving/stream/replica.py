"""serve-stream as one of several replicas: a session lives where its KV cache is, so it must always be reached there.

With `--replica-id` a session id names its replica (`<replica>.<32 hex>`), and with `--public-url` the create reply's
URLs are built from the address clients use for this replica (behind the shipped HAProxy config:
`http://proxy:8088/r/{replica}`, `{replica}` being filled in) instead of whatever address the request came in on.

`ReplicaRouting` (ASGI middleware) serves this replica's own prefix (`/r/<id>/...` is `/...` here, so the same URL works
through the proxy and straight to the replica) and answers 421 Misdirected Request, naming the owner and its URL, to
a request for another replica's prefix or session, before any API key check: the owner is in the id already, and only
the owner can check the session's stream token.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from starlette.responses import JSONResponse

from ..common.replica import REPLICA_ID

_PREFIX = re.compile(r"^/r/([^/]+)(/.*)?$")
_SESSION = re.compile(r"^/v1/stream/sessions/([^/.]+)\.[0-9a-f]{32}(?:/|$)")
PUBLIC_TEMPLATE = "{replica}"


@dataclass(frozen=True)
class ReplicaIdentity:
    replica_id: str | None = None
    public_url: str | None = None  # this replica's base URL for clients; "{replica}" stands for a replica id

    def __post_init__(self) -> None:
        if self.replica_id is not None and not REPLICA_ID.match(self.replica_id):
            raise ValueError(f"invalid replica id {self.replica_id!r}")
        if self.public_url is not None and not self.public_url.startswith(("http://", "https://")):
            raise ValueError(f"--public-url must be an http:// or https:// URL, got {self.public_url!r}")
        if self.public_url and PUBLIC_TEMPLATE in self.public_url and self.replica_id is None:
            raise ValueError("a --public-url with {replica} needs --replica-id")

    def new_session_id(self) -> str:
        token = uuid.uuid4().hex
        return f"{self.replica_id}.{token}" if self.replica_id else token

    def url_of(self, replica: str) -> str | None:
        """The base URL of `replica` when the public URL is a template (or it is this replica), else None."""
        if self.public_url is None or (PUBLIC_TEMPLATE not in self.public_url and replica != self.replica_id):
            return None
        return self.public_url.replace(PUBLIC_TEMPLATE, replica).rstrip("/")

    @property
    def base_url(self) -> str | None:
        return self.url_of(self.replica_id or "")

    def owner(self, path: str) -> tuple[str | None, str]:
        """(the replica another replica's request belongs to, or None; the path this replica serves). What cannot be
        a replica id names no owner: such a path is this replica's to answer (a 404)."""
        prefixed = _PREFIX.match(path)
        if prefixed is not None and REPLICA_ID.match(prefixed.group(1)):
            if prefixed.group(1) != self.replica_id:
                return prefixed.group(1), path
            path = prefixed.group(2) or "/"
        session = _SESSION.match(path)
        if session is not None and REPLICA_ID.match(session.group(1)) and session.group(1) != self.replica_id:
            return session.group(1), path
        return None, path


class ReplicaRouting:
    def __init__(self, app, identity: ReplicaIdentity):
        self.app, self.identity = app, identity

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self.identity.replica_id is None:
            await self.app(scope, receive, send)
            return
        owner, path = self.identity.owner(scope["path"])
        if owner is None:
            if path != scope["path"]:
                scope = {**scope, "path": path, "raw_path": path.encode()}
            await self.app(scope, receive, send)
            return
        owner_url = self.identity.url_of(owner)
        detail = (
            f"this is replica {self.identity.replica_id!r}; the request belongs to replica {owner!r}"
            + (f", at {owner_url}" if owner_url else "")
            + " (a session lives on the replica that holds its KV cache)"
        )
        response = JSONResponse({"detail": detail, "owner": owner, "owner_url": owner_url}, status_code=421)
        if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
            await response(scope, receive, send)
        else:  # no denial-response extension: refuse the handshake with our close code
            await send({"type": "websocket.close", "code": 4421, "reason": detail[:120]})
