"""The fields of a `POST /v1/videos` body, whatever its encoding: JSON, multipart/form-data or urlencoded.

JSON values arrive as they are. Form fields arrive as text, or as an `Upload` (a part with a filename or a
non-text Content-Type: a file). Some fields hold a list (`references`, `lora`): in a form they repeat, with or without
the `[]` suffix the OpenAI SDK and other qs-style encoders add (`references[]`), and a list of objects arrives as
`lora[][name]`, `lora[][scale]` pairs (the SDK's `extra_body={"lora": [{"name": ..., "scale": ...}]}`); an object
field arrives as `input_reference[image_url]`. Everything else is one value; the last one wins when it repeats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from ..common.http_errors import RequestError
from ..common.request_body import json_object, parse_form_parts

LIST_FIELDS = ("references", "lora")
_NAME = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")


@dataclass(frozen=True)
class Upload:
    """A file part of a multipart form."""

    data: bytes
    filename: str | None
    content_type: str | None

    def describe(self) -> dict[str, Any]:
        """What the job record keeps of it (never the bytes)."""
        return {"file": self.filename, "content_type": self.content_type, "bytes": len(self.data)}


def read_fields(content_type: str, body: bytes) -> dict[str, Any]:
    """{field: value}; 400 for a body that cannot be read, 415 for another content type."""
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime == "multipart/form-data":
        boundary = re.search(r'boundary="?([^";]+)"?', content_type)
        if boundary and body.strip() == b"--" + boundary.group(1).encode("latin-1") + b"--":
            return {}  # a form with no fields (the parser wants at least one part)
        return _collect((part.name, _part_value(part)) for part in parse_form_parts(content_type, body))
    if mime == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body.strip()))
        except (UnicodeDecodeError, ValueError) as exc:
            raise RequestError(400, f"malformed urlencoded body: {exc}") from None
        return _collect(pairs)
    if mime in ("application/json", ""):
        return json_object(body, '{"prompt": "..."}')
    raise RequestError(
        415, f"unsupported content type {mime!r}; send multipart/form-data, application/json or urlencoded form data"
    )


def _part_value(part) -> str | Upload:
    text_type = part.content_type is None or part.content_type.lower().startswith("text/")
    if part.filename is not None or not text_type:
        return Upload(part.data, part.filename, part.content_type)
    try:
        return part.data.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(400, f"form field {part.name!r} is not UTF-8 text") from None


def _collect(pairs) -> dict[str, Any]:
    """Form (name, value) pairs -> fields, rebuilding the lists and objects the names spell (module docstring)."""
    out: dict[str, Any] = {}
    for name, value in pairs:
        match = _NAME.match(name)
        base, path = (match.group(1), re.findall(r"\[([^\[\]]*)\]", match.group(2))) if match else (name, [])
        if not path:
            if base in LIST_FIELDS:
                _as_list(out, base).append(value)
            else:
                out[base] = value
        elif path == [""]:
            _as_list(out, base).append(value)
        elif len(path) == 1:
            target = out.get(base)
            out[base] = target = target if isinstance(target, dict) else {}
            target[path[0]] = value
        elif len(path) == 2 and path[0] == "" and path[1]:
            items = _as_list(out, base)
            if not items or not isinstance(items[-1], dict) or path[1] in items[-1]:
                items.append({})  # a key seen again starts the next object, as qs writes them
            items[-1][path[1]] = value
        else:
            out[name] = value  # not a shape we read: reported as an unknown field
    return out


def _as_list(out: dict[str, Any], name: str) -> list:
    if not isinstance(out.get(name), list):
        out[name] = [] if out.get(name) in (None, "") else [out[name]]
    return out[name]
