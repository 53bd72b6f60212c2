"""HTTP errors both services share: a client's mistake is a `RequestError` (4xx with a message meant for the user);
anything else that escapes a route is a server fault, logged with the request's id and answered with a generic 500.

Every error body has OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, which the OpenAI SDKs read
(they show `error.message` in the exception), plus `"detail"` with the same message, which this service's clients
read from before. Every HTTP response carries `X-Request-ID`: the client's own when it sent a sane one (so a proxy's
id follows the request), a fresh one otherwise. The 500 body names the id and nothing else, so a traceback never
reaches a client.
"""

from __future__ import annotations

import logging
import re
import uuid

from starlette.responses import JSONResponse

REQUEST_ID_HEADER = "x-request-id"
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_LEADING_FIELD = re.compile(r"^'([A-Za-z_][A-Za-z0-9_]{0,40})'")


# OpenAI's error types by status, and a default `code` for each (a RequestError may name its own).
_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
_CODES = {
    400: "bad_request",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    421: "misdirected_request",
    422: "invalid_value",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "service_unavailable",
}


class RequestError(Exception):
    """A request the server refuses: `status` (4xx, or 503 while shutting down) and a user-facing `detail`;
    `param`: the request field at fault, when one is; `code`: a short machine-readable reason (default: by status)."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(detail)
        self.status, self.detail, self.headers, self.param, self.code = status, detail, headers, param, code


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    """`{"error": {"message", "type", "param", "code"}, "detail": message}`: OpenAI's shape and this API's own."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    error = {"message": message, "type": kind, "param": param, "code": code or _CODES.get(status, f"http_{status}")}
    return {"error": error, "detail": message}


def error_response(
    status: int,
    detail: str,
    *,
    retry_after: int | None = None,
    headers: dict[str, str] | None = None,
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    """The error body (`error_body`) with the status; 429 and 503 say when to retry."""
    extra = dict(headers or {})
    if status in (429, 503):
        extra.setdefault("Retry-After", str(retry_after if retry_after is not None else 5))
    body = error_body(status, detail, param=param, code=code)
    return JSONResponse(body, status_code=status, headers=extra or None)


async def answer_request_error(_request, exc: RequestError) -> JSONResponse:
    """The exception handler both apps install for `RequestError`. Without an explicit `param`, a message that
    starts with a quoted field name ("'seconds' is 12; ...") names that field."""
    named = _LEADING_FIELD.match(exc.detail)
    param = exc.param or (named.group(1) if named else None)
    return error_response(exc.status, exc.detail, headers=exc.headers, param=param, code=exc.code)


async def answer_http_exception(request, exc) -> JSONResponse:
    """Starlette's own refusals (an unknown path: 404, a wrong method: 405) in the same shape, saying where the
    routes are listed."""
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code in (404, 405) and detail in ("Not Found", "Method Not Allowed"):
        what = "is not a route" if exc.status_code == 404 else "is not a method this route takes"
        detail = f"{request.method} {request.url.path} {what} of this service; GET /docs lists the routes"
    return error_response(exc.status_code, detail, headers=getattr(exc, "headers", None))


async def answer_validation_error(_request, exc) -> JSONResponse:
    """FastAPI's parameter validation (e.g. `?limit=abc`): a 422 whose message names each bad parameter; `detail`
    keeps FastAPI's list of errors."""
    errors = list(exc.errors())
    parts = []
    for err in errors:
        where = [str(p) for p in err.get("loc", ()) if p not in ("query", "path", "body", "header")]
        parts.append(f"'{'.'.join(where) or 'request'}': {err.get('msg', 'invalid')}")
    first = errors[0].get("loc", ()) if errors else ()
    param = str(first[-1]) if first else None
    body = error_body(422, "; ".join(parts) or "invalid request", param=param)
    body["detail"] = jsonable(errors)
    return JSONResponse(body, status_code=422)


def jsonable(errors: list) -> list:
    """FastAPI's error list without what JSON cannot hold (an exception object in `ctx`)."""
    from fastapi.encoders import jsonable_encoder

    return jsonable_encoder(errors, custom_encoder={Exception: str})


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
