"""argparse value types for numeric flags: a value out of range is a usage error naming the flag and the range, before
anything loads, not a traceback (a port past 65535) or a service that starts and refuses every request later.

Plain Python (no torch): the command lines are built without importing a model.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from .sizes import parse_size


def _number(kind: type, text: str) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _checked(kind: type, ok: Callable[[int | float], bool], rule: str) -> Callable[[str], int | float]:
    def check(text: str):
        value = _number(kind, text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    return check


def int_at_least(low: int) -> Callable[[str], int]:
    return _checked(int, lambda v: v >= low, f"{low} or more")


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An integer from `low` to `high`, both included."""
    return _checked(int, lambda v: low <= v <= high, f"{low} to {high}")


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
positive_float = _checked(float, lambda v: v > 0, "positive")
non_negative_float = _checked(float, lambda v: v >= 0, "0 or more")
finite_float = _checked(float, lambda v: True, "finite")
port = int_in(0, 65535)


def canvas_size(text: str) -> str:
    """WIDTHxHEIGHT of two positive integers, written back as such (what the request parsers take); whether the
    model can make that canvas is the model's to say."""
    try:
        width, height = parse_size(text, what="the size")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if width < 1 or height < 1:
        raise argparse.ArgumentTypeError(f"width and height must be positive, got {text}")
    return f"{width}x{height}"
