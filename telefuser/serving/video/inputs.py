"""A request's keyframes and references: `input_reference` (the first keyframe, as the OpenAI SDK uploads it),
`last_frame` and `references`, each a file part or a base64 data URL, read into `MediaInput`s and the task they make.

References (Ref2VA) -> "ref2va", a keyframe (FL2VA) -> "fl2va", neither -> "t2va"; keyframes and references together
are refused (two DiTs), and so are the counts and kinds MiniMax H3 does not take (its own `ConditionRequest` rules,
asked with stand-ins before any reference is decoded). This server fetches no URL and opens no path.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from telefuser.pipelines.minimax_h3.conditions import (
    MAX_REFERENCES,
    AudioReference,
    ConditionRequest,
    ImageReference,
    VideoReference,
)

from ..common.http_errors import RequestError
from ..common.request_body import short_repr
from .contract import MediaInput
from .form import Upload
from .media import MediaLimits, identify

KEYFRAME_FIELDS = {"input_reference": "first_frame", "last_frame": "last_frame"}
MEDIA_FIELDS = (*KEYFRAME_FIELDS, "references")
URL_KEYS = ("image_url", "video_url", "audio_url", "url")  # {"image_url": "data:..."}: OpenAI's reference object
_DATA_URL = re.compile(r"^data:([^;,]*)((?:;[^;,]*)*),", re.IGNORECASE)
TASK_INPUTS = {"t2va": "text only", "fl2va": "keyframes", "ref2va": "references"}


@dataclass(frozen=True)
class RequestInputs:
    media: tuple[MediaInput, ...]  # with their bytes
    task: str
    described: dict[str, Any]  # per field, what the job record keeps instead of the bytes


def read_inputs(given: dict[str, Any], limits: MediaLimits) -> RequestInputs:
    """The media fields of `given` (JSON values or form values), checked and identified."""
    references = given.get("references")
    if references is not None and not isinstance(references, list):
        references = [references]
    references = [r for r in references or () if r not in (None, "")]
    if len(references) > MAX_REFERENCES:
        raise RequestError(422, f"{len(references)} references; MiniMax H3 accepts at most {MAX_REFERENCES}")
    requested_task(given)
    media, described = [], {}
    for field, role in KEYFRAME_FIELDS.items():
        if field in given:
            item, record = _read(given[field], f"'{field}'", role, limits, images_only=True)
            media.append(item)
            described[field] = record
    for index, value in enumerate(references):
        item, record = _read(value, f"references[{index}]", "reference", limits, images_only=False)
        media.append(item)
        described.setdefault("references", []).append(record)
    return RequestInputs(tuple(media), _task(media), described)


def requested_task(given: dict[str, Any]) -> str:
    """The task the fields ask for, before anything is decoded; keyframes and references together are refused."""
    keyframes = any(field in given for field in KEYFRAME_FIELDS)
    if keyframes and given.get("references") not in (None, "", []):
        _task([MediaInput("first_frame", "image", "", 0), MediaInput("reference", "image", "", 0)])
    return "ref2va" if given.get("references") not in (None, "", []) else "fl2va" if keyframes else "t2va"


def media_fields(given: dict[str, Any]) -> list[str]:
    """The media fields a request sent, in `MEDIA_FIELDS` order."""
    return [field for field in MEDIA_FIELDS if given.get(field) not in (None, "", [])]


def check_task(task: str, tasks: tuple[str, ...], partition: str | None, fields: list[str] | None = None) -> None:
    """422 when this server's model cannot run `task`, naming the request's media `fields` (a model without
    partitions) or saying which server can (MiniMax H3's partitions)."""
    if task in tasks:
        return
    if partition is None:
        takes = "text only" if tuple(tasks) == ("t2va",) else ", ".join(f"{t} ({TASK_INPUTS[t]})" for t in tasks)
        named = ", ".join(f"'{field}'" for field in fields or ())
        raise RequestError(
            422,
            f"{named + ': ' if named else ''}this server's model takes {takes}; a {task} request "
            f"({TASK_INPUTS[task]}) cannot run",
            param=(fields or [None])[0],
        )
    from telefuser.pipelines.minimax_h3.pipeline import partition_for_task

    needed = partition_for_task(task)
    raise RequestError(
        422,
        f"a {task} request ({TASK_INPUTS[task]}) runs on MiniMax H3's {needed} DiT, but this server serves the "
        f"{partition} partition ({', '.join(tasks)}); send it to a server started with --task-partition {needed}",
    )


def _read(value: Any, what: str, role: str, limits: MediaLimits, *, images_only: bool):
    if isinstance(value, Upload):
        data, source = value.data, {"file": value.filename, "content_type": value.content_type}
    else:
        data, mime = _data_url(value, what, limits, images_only)
        source = {"data_url": mime}
    kind, width, height = identify(data, what, limits, images_only=images_only)
    item = MediaInput(role, kind, hashlib.sha256(data).hexdigest(), len(data), width or None, height or None, data)
    return item, {**source, **item.summary()}


def _data_url(value: Any, what: str, limits: MediaLimits, images_only: bool) -> tuple[bytes, str]:
    if isinstance(value, dict):
        if "file_id" in value:
            raise RequestError(422, f"{what}: file ids are not supported here; upload the file or send a data URL")
        keys = [k for k in value if k in URL_KEYS]
        if len(keys) != 1 or len(value) != 1:
            raise RequestError(422, f'{what} must be {{"image_url": "data:...;base64,..."}}, got keys {list(value)}')
        value = value[keys[0]]
    if not isinstance(value, str):
        raise RequestError(422, f"{what} must be a file part or a data URL, got {type(value).__name__}")
    match = _DATA_URL.match(value.strip())
    if match is None:
        if re.match(r"^[a-z][a-z0-9+.-]*://", value.strip(), re.IGNORECASE):
            raise RequestError(422, f"{what}: this server does not fetch URLs; upload the file or send a data URL")
        raise RequestError(
            422, f"{what} must be a file part or a data URL (data:image/png;base64,...), got {short_repr(value)}"
        )
    if ";base64" not in match.group(2).lower():
        raise RequestError(422, f"{what}: a data URL must be base64-encoded (data:<type>;base64,...)")
    payload = re.sub(r"\s+", "", value.strip()[match.end() :])
    # refused before decoding when it is past every limit it could fall under; identify() checks the kind's own
    limit = limits.max_image_bytes if images_only else max(limits.max_image_bytes, limits.max_clip_bytes)
    if len(payload) // 4 * 3 > limit + 3:
        raise RequestError(413, f"{what} is about {len(payload) // 4 * 3:,} bytes; the limit is {limit:,} bytes")
    try:
        return base64.b64decode(payload, validate=True), match.group(1) or "unknown"
    except (binascii.Error, ValueError) as exc:
        raise RequestError(422, f"{what} is not valid base64: {exc}") from None


def _task(media: list[MediaInput]) -> str:
    """The task, by MiniMax H3's own rules on these inputs (stand-ins: nothing is decoded here)."""
    keyframe = {m.role: _PIXEL for m in media if m.role != "reference"}
    stand_ins = {
        "image": ImageReference(_PIXEL),
        "video": VideoReference(_PIXEL[None], 24.0),
        "audio": AudioReference(np.zeros((1, 1), np.float32)),
    }
    refs = [stand_ins[m.kind] for m in media if m.role == "reference"]
    try:
        return ConditionRequest.of(keyframe.get("first_frame"), keyframe.get("last_frame"), refs).task
    except ValueError as exc:
        raise RequestError(422, str(exc)) from None


_PIXEL = np.zeros((1, 1, 3), np.uint8)
