"""Request limits both services share: each has a name, a value, the flag that overrides it and where the default
came from, so `/v1/service/metadata` can show them and a refusal can name the one it hit.

Canvas defaults come from the model's native canvas (twice its long edge, four times its area; why: serving/README.md);
memory comes from the device (memory_budget.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ...arg_types import positive_int
from .http_errors import RequestError


@dataclass(frozen=True)
class Limit:
    name: str  # as in metadata and in refusals, e.g. "max_pixels"
    value: int | float | None  # None: not bounded (e.g. a model without a memory estimate)
    flag: str  # the command-line flag that overrides it
    source: str  # where the value came from

    def refusal(self, what: str, shown: str | None = None) -> RequestError:
        """422 naming this limit: "<what>; the limit is max_pixels=... (--max-pixels; <source>)"."""
        value = shown if shown is not None else f"{self.value:,}" if isinstance(self.value, int) else f"{self.value:g}"
        return RequestError(422, f"{what}; the limit is {self.name}={value} ({self.flag}; {self.source})")


@dataclass
class CanvasLimitFlags:
    """The limit flags both services take (None: derive the default); each service adds its own."""

    max_width: int | None = None
    max_height: int | None = None
    max_pixels: int | None = None
    max_frames: int | None = None

    @classmethod
    def from_args(cls, args) -> CanvasLimitFlags:
        """The flags of a parsed command line (each field is its flag's dest)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def size_text(nbytes: float) -> str:
    """Bytes for a message: GiB from one GiB up, MiB below."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def amount(value: int) -> str:
    """A count for a message: digits grouped, and a client's 4,000-digit number not echoed back in full."""
    return f"{value:,}" if abs(value) < 10**15 else f"about 10^{len(str(abs(value))) - 1}"


def pick(name: str, flag: str, override: Any, derived: Any, source: str) -> Limit:
    """The flag's value when given, else the derived default and its source."""
    if override is not None:
        return Limit(name, override, flag, f"set by {flag}")
    return Limit(name, derived, flag, source)


def canvas_limits(native: tuple[int, int], *, max_width=None, max_height=None, max_pixels=None) -> list[Limit]:
    """max_width, max_height and max_pixels for a model whose native canvas is `native` (width, height)."""
    width, height = native
    side, area = 2 * max(width, height), 4 * width * height
    why_side, why_area = (
        f"model: 2 x the long edge of its {width}x{height} canvas",
        f"model: 4 x its {width}x{height} canvas",
    )
    return [
        pick("max_width", "--max-width", max_width, side, why_side),
        pick("max_height", "--max-height", max_height, side, why_side),
        pick("max_pixels", "--max-pixels", max_pixels, area, why_area),
    ]


def add_canvas_limit_args(parser, what: str) -> object:
    """The request-limit group with the flags both services share; `what` names a request ("canvas", "clip")."""
    group = parser.add_argument_group(
        "request limits (defaults derived from the model and the device; see /v1/service/metadata)"
    )
    group.add_argument(
        "--max-width", type=positive_int, default=None, help=f"widest {what} (default: 2 x the model's long edge)"
    )
    group.add_argument(
        "--max-height", type=positive_int, default=None, help=f"tallest {what} (default: as --max-width)"
    )
    group.add_argument(
        "--max-pixels", type=positive_int, default=None, help="pixels per frame (default: 4 x the model's canvas)"
    )
    return group


class LimitSet:
    """The limits of one service, by name."""

    def __init__(self, limits: list[Limit]):
        self._limits = {limit.name: limit for limit in limits}

    def __getitem__(self, name: str) -> Limit:
        return self._limits[name]

    def value(self, name: str) -> Any:
        return self._limits[name].value

    def values(self) -> dict[str, Any]:
        return {name: limit.value for name, limit in self._limits.items()}

    def sources(self) -> dict[str, str]:
        return {name: limit.source for name, limit in self._limits.items()}

    def check_canvas(self, width: int, height: int, what: str) -> None:
        """422 when a width x height canvas passes max_width, max_height or max_pixels."""
        if width > self.value("max_width"):
            raise self["max_width"].refusal(f"{what} is {width} pixels wide")
        if height > self.value("max_height"):
            raise self["max_height"].refusal(f"{what} is {height} pixels high")
        if width * height > self.value("max_pixels"):
            raise self["max_pixels"].refusal(f"{what} has {width * height:,} pixels ({width}x{height})")

    def check_memory(self, estimate: dict[str, int] | None, what: str, name: str) -> None:
        """422 when the estimated bytes (by term) pass the memory limit `name`."""
        limit = self[name]
        if estimate is None or limit.value is None:
            return
        total = sum(estimate.values())
        if total > limit.value:
            terms = ", ".join(f"{k} {size_text(v)}" for k, v in estimate.items() if v)
            raise limit.refusal(f"{what} needs an estimated {size_text(total)} ({terms})", shown=size_text(limit.value))
