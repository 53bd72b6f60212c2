"""HTTP errors both services share: a client's mistake is a `RequestError` (4xx with a message meant for the user);
anything else that escapes a route is a server fault, logged with the request's id and answered with a generic 500.

Every HTTP response carries `X-Request-ID`: the client's own when it sent a sane one (so a proxy's id follows the
request), a fresh one otherwise. The 500 body names the id and nothing else, so a traceback never reaches a client.
"""

from __future__ import annotations

import logging
import re
import uuid

from starlette.responses import JSONResponse

REQUEST_ID_HEADER = "x-request-id"
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class RequestError(Exception):
    """A request the server refuses: `status` (4xx, or 503 while shutting down) and a user-facing `detail`."""

    def __init__(self, status: int, detail: str, *, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


def error_response(
    status: int, detail: str, *, retry_after: int | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """`{"detail": ...}` with the status; 429 and 503 say when to retry."""
    extra = dict(headers or {})
    if status in (429, 503):
        extra.setdefault("Retry-After", str(retry_after if retry_after is not None else 5))
    return JSONResponse({"detail": detail}, status_code=status, headers=extra or None)


async def answer_request_error(_request, exc: RequestError) -> JSONResponse:
    """The exception handler both apps install for `RequestError`."""
    return error_response(exc.status, exc.detail, headers=exc.headers)


def request_id_of(scope) -> str | None:
    return scope.get("state", {}).get("request_id")


class ServerFaultMiddleware:
    """Outermost middleware of an app: request ids, and a generic 500 for an exception no handler answered."""

    def __init__(self, app, logger: logging.Logger):
        self.app, self.log = app, logger

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = _header(scope, REQUEST_ID_HEADER.encode())
        request_id = given if given and _SANE_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message) -> None:
            nonlocal started
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                started = True
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (REQUEST_ID_HEADER.encode(), request_id.encode())],
                }
            elif message["type"] == "websocket.accept":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:  # the last line of defence: log it, answer 500, keep serving
            method = scope.get("method", "WEBSOCKET")
            self.log.exception("request %s (%s %s) failed with a server error", request_id, method, scope.get("path"))
            if scope["type"] == "http" and not started:
                detail = f"internal server error (request id {request_id}); the server log has the details"
                await error_response(500, detail)(scope, receive, send_with_id)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
