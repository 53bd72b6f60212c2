"""Optional API keys for both services: `--api-key KEY` (repeatable) and/or `TELEFUSER_API_KEY`; off by default.

With keys set, a request needs `Authorization: Bearer <key>` except on the paths an app declares public; a WebSocket
or SSE route may also take `?token=...` (the app decides which tokens open which path). Keys are compared as SHA-256
digests with `hmac.compare_digest` against every key, so neither a key's timing nor its length leaks.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Callable, Iterable
from urllib.parse import parse_qsl

from starlette.responses import JSONResponse

from .http_errors import error_body

ENV_VAR = "TELEFUSER_API_KEY"
_BEARER = re.compile(r"^\s*bearer\s+(\S+)\s*$", re.IGNORECASE)
_TOKEN_IN_TEXT = re.compile(r"(token=)[^&\s\"']+")


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class ApiKeys:
    """The configured keys; `enabled` is False when there are none (the service is open)."""

    def __init__(self, keys: Iterable[str] = ()):
        cleaned = []
        for key in keys:
            if not key or any(c.isspace() or not c.isprintable() for c in key):
                raise ValueError("an API key must be non-empty printable text without spaces")
            cleaned.append(key)
        self._digests = [_digest(k) for k in dict.fromkeys(cleaned)]

    @classmethod
    def from_sources(cls, flags: Iterable[str] | None, environ=os.environ) -> ApiKeys:
        """`--api-key` values plus `TELEFUSER_API_KEY` (either alone is enough)."""
        keys = list(flags or [])
        if environ.get(ENV_VAR):
            keys.append(environ[ENV_VAR].strip())
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @property
    def count(self) -> int:
        return len(self._digests)

    def matches(self, token: str | None) -> bool:
        if token is None:
            return False
        given, ok = _digest(token), False
        for key in self._digests:  # no early exit: the time does not say which key (or whether one) matched
            ok |= hmac.compare_digest(given, key)
        return ok


def bearer_token(scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            match = _BEARER.match(value.decode("latin-1"))
            return match.group(1) if match else ""
    return None


def query_token(scope) -> str | None:
    query = scope.get("query_string", b"").decode("latin-1")
    return next((v for k, v in parse_qsl(query, keep_blank_values=True) if k == "token"), None)


class ApiKeyMiddleware:
    """Refuses requests without a valid key (see the module docstring). `query_token_ok(path, token)` says whether a
    `?token=` opens that path; None: no path accepts a query token."""

    def __init__(
        self,
        app,
        keys: ApiKeys,
        *,
        public: Callable[[str], bool],
        query_token_ok: Callable[[str, str], bool] | None = None,
    ):
        self.app, self.keys, self.public, self.query_token_ok = app, keys, public, query_token_ok

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.keys.enabled or self.public(scope["path"]):
            await self.app(scope, receive, send)
            return
        header = bearer_token(scope)
        if header is not None and self.keys.matches(header):
            await self.app(scope, receive, send)
            return
        token = query_token(scope) if self.query_token_ok is not None else None
        if token is not None and self.query_token_ok(scope["path"], token):
            await self.app(scope, receive, send)
            return
        if header == "":
            detail = "the Authorization header must be 'Bearer <API key>'"
        elif header is not None or token is not None:
            detail = "invalid API key"
        else:
            detail = "this server requires an API key: send the header 'Authorization: Bearer <API key>'"
            if self.query_token_ok is not None:
                detail += " (WebSocket and SSE streams also accept ?token=<API key or the session's stream token>)"
        response = JSONResponse(
            error_body(401, detail), status_code=401, headers={"WWW-Authenticate": 'Bearer realm="telefuser"'}
        )
        if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
            await response(scope, receive, send)  # Starlette sends a WebSocket refusal as the denial response
        else:  # a server without the denial extension: closing before accept refuses the handshake (HTTP 403)
            await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})


class RedactTokens(logging.Filter):
    """Access-log lines print the query string: hide `token=` values (keys or stream tokens) in them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, str) and "token=" in a for a in record.args):
            record.args = tuple(
                _TOKEN_IN_TEXT.sub(r"\1<redacted>", a) if isinstance(a, str) else a for a in record.args
            )
        return True


def add_auth_args(group) -> None:
    group.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every route but health (repeatable; also "
        f"${ENV_VAR}, which keeps the key out of the process list). Default: no key",
    )


def keys_from_args(args: argparse.Namespace) -> ApiKeys:
    """The keys of `--api-key` and the environment; a bad key ends the command with a message (before any model
    is built, when called first thing)."""
    try:
        return ApiKeys.from_sources(getattr(args, "api_key", None))
    except ValueError as exc:
        raise SystemExit(f"--api-key / {ENV_VAR}: {exc}") from None
