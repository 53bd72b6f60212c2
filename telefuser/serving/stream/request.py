"""Parsing `POST /v1/stream/sessions`: a JSON body or multipart form -> prompt, image array, config.

Every failure is a `RequestError` with the HTTP status (PROTOCOL.md lists which) and a message meant for the user;
the image's pixel count is read from its header before it is decoded.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.http_errors import RequestError
from ..common.limits import Limit
from ..common.request_body import check_prompt, json_object, parse_json, parse_multipart
from .contract import COMMON_CONFIG_KEYS, check_config
from .envelope import CODECS

__all__ = ["CreateRequest", "RequestError", "decode_image", "parse_create_request"]

FIELDS = ("prompt", "image", "config", "codec")
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
MAX_IMAGE_SIDE = 8192
DEFAULT_IMAGE_PIXELS = Limit("max_image_pixels", 40_000_000, "--max-image-pixels", "service default")
_DATA_URL = re.compile(r"^data:image/[a-zA-Z0-9.+-]+;base64,")


@dataclass
class CreateRequest:
    prompt: str
    image: np.ndarray  # uint8 HxWx3
    config: dict[str, Any]
    codec: str | None


def parse_create_request(
    content_type: str,
    body: bytes,
    image_pixels: Limit = DEFAULT_IMAGE_PIXELS,
    config_keys: Sequence[str] = COMMON_CONFIG_KEYS,
) -> CreateRequest:
    """The create request's fields, checked; `config_keys`: the model's (contract.config_keys)."""
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime == "multipart/form-data":
        fields = _fields_from_multipart(content_type, body)
    elif mime in ("application/json", ""):
        fields = _fields_from_json(body)
    else:
        raise RequestError(415, f"unsupported content type {mime!r}; send application/json or multipart/form-data")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        named = ", ".join(repr(name)[:40] for name in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise RequestError(422, f"unknown field(s) {named}; allowed: {', '.join(FIELDS)}")
    prompt = check_prompt(fields.get("prompt"))
    image = fields.get("image")
    if image is None:
        raise RequestError(422, "'image' is required: a base64 PNG/JPEG string (JSON) or an image file (multipart)")
    if isinstance(image, str):
        image = _b64decode(image)
    elif not isinstance(image, bytes):
        raise RequestError(422, f"'image' must be a base64 string, got {type(image).__name__}")
    codec = fields.get("codec")
    if codec is not None and (not isinstance(codec, str) or codec not in CODECS):
        raise RequestError(422, f"'codec' must be one of {', '.join(CODECS)}, got {repr(codec)[:40]}")
    try:
        config = check_config(fields.get("config") or {}, config_keys)
    except ValueError as exc:
        raise RequestError(422, f"invalid config: {exc}") from None
    return CreateRequest(prompt=prompt, image=decode_image(image, image_pixels), config=config, codec=codec)


def decode_image(data: bytes, pixels: Limit = DEFAULT_IMAGE_PIXELS) -> np.ndarray:
    """uint8 HxWx3. The size is read from the header and checked before any pixel is decoded (a small file can
    declare a huge canvas); the decoded array is checked against that header afterwards."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise RequestError(400, "'image' is empty")
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
            width, height = img.size
            if width * height > pixels.value:
                raise pixels.refusal(f"'image' is {width}x{height} = {width * height:,} pixels (read from its header)")
            if max(width, height) > MAX_IMAGE_SIDE:
                raise RequestError(422, f"'image' is {width}x{height}; the largest side allowed is {MAX_IMAGE_SIDE}")
            array = np.asarray(img.convert("RGB")).copy()
    except RequestError:
        raise
    except Image.DecompressionBombError as exc:  # Pillow's own check, for canvases far past ours, fires in open()
        raise pixels.refusal(f"'image' declares a canvas too large to decode ({exc})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, TypeError, EOFError) as exc:
        raise RequestError(400, f"'image' could not be decoded as {'/'.join(IMAGE_FORMATS)}: {exc}") from None
    if array.dtype != np.uint8 or array.shape != (height, width, 3):
        raise RequestError(
            400, f"'image' decoded to {array.dtype} {array.shape}, not the {width}x{height} RGB its header declares"
        )
    return array


def _b64decode(text: str) -> bytes:
    text = _DATA_URL.sub("", text.strip(), count=1)
    try:
        return base64.b64decode(re.sub(r"\s+", "", text), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(400, f"'image' is not valid base64: {exc}") from None


def _fields_from_json(body: bytes) -> dict[str, Any]:
    return json_object(body, '{"prompt": ..., "image": ..., "config": {...}}')


def _fields_from_multipart(content_type: str, body: bytes) -> dict[str, Any]:
    """Form fields: prompt (text), image (file), config (JSON text), codec (text)."""
    parts = parse_multipart(content_type, body)
    fields: dict[str, Any] = {}
    for name, (value, filename) in parts.items():
        if name == "image":
            fields[name] = value
            continue
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(400, f"form field {name!r} is not UTF-8 text") from None
        if name == "config":
            fields[name] = parse_json(text, what="form field 'config'") if text.strip() else {}
        else:
            fields[name] = text
    return fields
