"""A canvas written as text: ``"WIDTHxHEIGHT"`` (``"W*H"`` too, any case), parsed in one place.

The services' request parsers keep their own stricter checks and client-facing messages (serving/*/request.py,
serving/stream/contract.py); this is for sizes the engine itself holds: defaults, flags, metadata, plans.
"""

from __future__ import annotations


def parse_size(text: str, *, what: str = "size", example: str = "832x480") -> tuple[int, int]:
    """(width, height) of `text`; ValueError naming `what` and an `example` when it is not two integers."""
    try:
        width, height = (int(part) for part in str(text).strip().lower().replace("*", "x").split("x"))
    except ValueError:
        raise ValueError(f"{what} must be WIDTHxHEIGHT (e.g. {example}), got {text!r}") from None
    return width, height
