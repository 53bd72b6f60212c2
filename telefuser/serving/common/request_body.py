"""Reading a request body safely: bounded in bytes while it arrives, JSON bounded in depth, no NaN/Infinity or
overlong numbers, and every string encodable as UTF-8 (a JSON escape such as "\\ud800" decodes to a lone surrogate,
which no response, log or record can encode later).

The same checks serve WebSocket messages; multipart forms are parsed with the standard library (no python-multipart).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .http_errors import RequestError

MAX_SEED = 2**63 - 1  # a request's seed: torch generators take 64-bit seeds

MAX_JSON_DEPTH = 32  # nesting levels of arrays and objects; real requests use three
MAX_PROMPT_CHARS = 10_000
MAX_FORM_PARTS = 64  # a form has a handful of fields; more is not a client of ours


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


def check_prompt(prompt: Any) -> str:
    """A request's prompt: a non-empty string of at most MAX_PROMPT_CHARS; 422 otherwise."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise RequestError(422, "'prompt' is required: a non-empty string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise RequestError(422, f"'prompt' is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    return prompt


def short_repr(value: Any, limit: int = 60) -> str:
    """repr() for a message, cut short: a refusal must not echo a client's megabyte back."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


@dataclass(frozen=True)
class FormPart:
    """One part of a multipart form, in the order sent."""

    name: str
    data: bytes
    filename: str | None  # set for a file part
    content_type: str | None  # the part's own Content-Type header, if it has one


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[bytes, str | None]]:
    """RFC 7578 form data -> {name: (bytes, filename)}; the last part wins on duplicate names."""
    return {part.name: (part.data, part.filename) for part in parse_form_parts(content_type, body)}


def parse_form_parts(content_type: str, body: bytes) -> list[FormPart]:
    """RFC 7578 form data -> every part in order (a field may repeat: a list of files)."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not match:
        raise RequestError(400, "multipart/form-data without a boundary")
    delimiter = b"--" + match.group(1).encode("latin-1")
    pieces = body.split(delimiter)
    if len(pieces) < 3 or not pieces[-1].startswith(b"--"):
        raise RequestError(400, "malformed multipart body: missing the closing boundary")
    if len(pieces) - 2 > MAX_FORM_PARTS:
        raise RequestError(400, f"malformed multipart body: {len(pieces) - 2} parts; at most {MAX_FORM_PARTS}")
    out: list[FormPart] = []
    for raw in pieces[1:-1]:
        if not raw.startswith(b"\r\n") or not raw.endswith(b"\r\n"):
            raise RequestError(400, "malformed multipart body: parts must be CRLF-delimited")
        head, sep, content = raw[2:-2].partition(b"\r\n\r\n")
        if not sep:
            raise RequestError(400, "malformed multipart body: a part has no header/body separator")
        lines = head.decode("latin-1").split("\r\n")
        disposition = next((line for line in lines if line.lower().startswith("content-disposition:")), "")
        name = re.search(r'\bname="([^"]*)"', disposition)
        if not name:
            raise RequestError(400, "malformed multipart body: a part has no Content-Disposition name")
        filename = re.search(r'\bfilename="([^"]*)"', disposition)
        part_type = next(
            (line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("content-type:")), None
        )
        out.append(FormPart(name.group(1), content, filename.group(1) if filename else None, part_type))
    return out
