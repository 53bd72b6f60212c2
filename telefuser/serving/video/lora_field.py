"""A request's `lora` field: which LoRAs of the server's --lora-dir to merge for this job, and at what scales.

Forms (JSON, or form fields, repeated or with the `[]` suffix): a list of `{"name": ..., "scale": ...}` objects
(scale 1.0 when left out) or of `"name"` / `"name:scale"` strings; one such value alone; in a form also JSON text or
`"a:1,b:0.5"`. A name is a file name in --lora-dir (with or without `.safetensors`), never a path. Whether the file
exists and fits the model is the runner's to say (lora_library.py); how many and which scales, the policy's here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..common.http_errors import RequestError
from ..common.request_body import parse_json, short_repr

SUFFIX = ".safetensors"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class LoraPolicy:
    enabled: bool = False  # the server has a --lora-dir
    max_loras: int = 4  # --max-loras
    min_scale: float = -4.0  # --lora-scale-range MIN MAX
    max_scale: float = 4.0


def parse_loras(value: Any, policy: LoraPolicy) -> tuple[tuple[str, float], ...]:
    """(name, scale) pairs in merge order; 422 naming the rule broken."""
    entries = [e for e in _entries(value) if e not in (None, "")]
    if entries and not policy.enabled:
        raise RequestError(422, "this server takes no LoRAs: it was started without --lora-dir")
    if len(entries) > policy.max_loras:
        raise RequestError(422, f"{len(entries)} LoRAs; the limit is max_loras={policy.max_loras} (--max-loras)")
    loras = [_entry(entry, policy) for entry in entries]
    names = [name for name, _ in loras]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise RequestError(422, f"LoRA {twice[0]!r} is named twice; give it once, with the sum of the scales")
    return tuple(loras)


def check_name(name: Any) -> str:
    """A LoRA name as a file stem in --lora-dir; 422 for anything path-like."""
    if not isinstance(name, str):
        raise RequestError(422, f"a LoRA name must be a string, got {type(name).__name__}")
    stem = name.strip().removesuffix(SUFFIX)
    if not _NAME.match(stem) or ".." in stem:
        raise RequestError(
            422,
            f"LoRA name {short_repr(name)} is not a file name: LoRAs are named by their file in the server's "
            "--lora-dir (letters, digits, '.', '_', '-'; no paths)",
        )
    return stem


def _entries(value: Any) -> list[Any]:
    if isinstance(value, list):
        out = []
        for item in value:
            out += _entries(item) if isinstance(item, str) else [item]
        return out
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "{")):  # JSON text in a form field
            parsed = parse_json(text, what="'lora'")
            return parsed if isinstance(parsed, list) else [parsed]
        return [part.strip() for part in text.split(",")]
    return [value]


def _entry(entry: Any, policy: LoraPolicy) -> tuple[str, float]:
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"name", "scale"})
        if unknown or "name" not in entry:
            raise RequestError(422, f'a LoRA is {{"name": ..., "scale": ...}}, got keys {sorted(entry)[:5]}')
        name, scale = entry["name"], entry.get("scale", 1.0)
    elif isinstance(entry, str):
        name, sep, scale = entry.rpartition(":")
        name, scale = (name, scale) if sep else (entry, 1.0)
    else:
        raise RequestError(422, f'a LoRA is "name:scale" or {{"name", "scale"}}, got {type(entry).__name__}')
    stem = check_name(name)
    value = _scale(scale, stem)
    if not policy.min_scale <= value <= policy.max_scale:
        raise RequestError(
            422,
            f"LoRA {stem!r} scale {value:g} is out of range; the limit is lora_scale_range=[{policy.min_scale:g}, "
            f"{policy.max_scale:g}] (--lora-scale-range)",
        )
    return stem, value


def _scale(scale: Any, name: str) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, str)):
        raise RequestError(422, f"LoRA {name!r}: the scale must be a number, got {short_repr(scale)}")
    try:
        value = float(scale.strip() if isinstance(scale, str) and len(scale) <= 64 else scale)
    except (ValueError, OverflowError):
        raise RequestError(422, f"LoRA {name!r}: the scale must be a number, got {short_repr(scale)}") from None
    if not math.isfinite(value):
        raise RequestError(422, f"LoRA {name!r}: the scale must be a finite number, got {short_repr(scale)}")
    return value
