"""Reading a request body safely: bounded in bytes while it arrives, JSON bounded in depth, no NaN/Infinity or
overlong numbers, and every string encodable as UTF-8 (a JSON escape such as "\\ud800" decodes to a lone surrogate,
which no response, log or record can encode later).

Bodies that cannot be read are 400, oversized ones 413, readable ones with unencodable text 422. The same checks
serve WebSocket messages (`parse_json` with `what="message"`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .http_errors import RequestError

MAX_JSON_DEPTH = 32  # nesting levels of arrays and objects; real requests use three


class _Refused(ValueError):
    pass


def _no_constants(name: str) -> float:
    raise _Refused(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text} is too large for a JSON number")
    return value


def parse_json(data: bytes | str, *, what: str = "JSON body", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The decoded value; RequestError(400) when it is not strict, bounded JSON; RequestError(422) for bad text."""
    try:
        value = json.loads(data, parse_constant=_no_constants, parse_float=_finite_float)
    except RecursionError:
        raise RequestError(400, f"malformed {what}: nested deeper than {max_depth} levels") from None
    except _Refused as exc:
        raise RequestError(400, f"malformed {what}: {exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"malformed {what}: {exc}") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise RequestError(400, f"malformed {what}: {exc}") from None
    problem = inspect_value(value, max_depth)
    if problem is not None:
        status, message = problem
        raise RequestError(status, f"{'malformed ' if status == 400 else ''}{what}: {message}")
    return value


def inspect_value(value: Any, max_depth: int = MAX_JSON_DEPTH) -> tuple[int, str] | None:
    """(status, reason) for the first string that is not valid Unicode or nesting past `max_depth`; None if fine.
    Iterative, so a deep value cannot exhaust the stack here."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if not encodable(item):
                where = f"'{path}'" if path else "a string"
                return 422, f"{where} is not valid Unicode text (it holds a lone surrogate); send UTF-8"
        elif isinstance(item, (dict, list)):
            if depth >= max_depth:
                return 400, f"nested deeper than {max_depth} levels"
            if isinstance(item, dict):
                for key, child in item.items():
                    if not encodable(key):
                        return 422, "a field name is not valid Unicode text (it holds a lone surrogate); send UTF-8"
                    stack.append((child, f"{path}.{key}" if path else key, depth + 1))
            else:
                stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
    return None


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encodable_text(text: str) -> str:
    """`text` with any lone surrogate spelled out as \\udXXX: text from elsewhere (an exception's message) made safe
    to store and send."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_object(body: bytes, example: str) -> dict[str, Any]:
    """A request body that must be one JSON object; 400 with a reason (and `example` when it is empty) otherwise."""
    if not body.strip():
        raise RequestError(400, f"empty request body; send a JSON object such as {example}")
    data = parse_json(body)
    if not isinstance(data, dict):
        raise RequestError(400, f"the JSON body must be an object, got {type(data).__name__}")
    return data


async def read_body(request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` bytes (a declared Content-Length is checked first, so
    an oversized upload is refused before it is read; a chunked one is cut off while it streams)."""
    from starlette.requests import ClientDisconnect

    length = request.headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise RequestError(413, f"request body is {int(length)} bytes; the limit is {limit} (max_body_bytes)")
    parts, size = [], 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise RequestError(413, f"request body is over {limit} bytes (max_body_bytes)")
            parts.append(part)
    except ClientDisconnect:
        raise RequestError(400, "the client disconnected before the request body was complete") from None
    return b"".join(parts)
