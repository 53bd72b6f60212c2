"""Timed control traces for a stream session. No aiperf imports.

A trace is JSON: either a list of steps or `{"controls": [steps], ...}` (other keys are documentation). A step holds
keys, as the service's control state (`POST .../control {"keys": [...]}`; `[]` releases everything), and says when:

    {"delay_s": 2.5, "keys": ["W"]}        2.5 s after the first chunk arrived (the stream's start, as a viewer sees it)
    {"after_chunk": 4, "keys": ["W", "J"]}  right after chunk 4 arrived (a chunk boundary)

The service applies a control from the next chunk that has not started (`applies_from_chunk` in its answer), so a
step never changes a chunk already in progress. Steps are sent in time order; each answer is recorded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The keys a client may send (the model's KEY_BINDINGS, telefuser/models/lingbot_world_v2/controls.py; this plugin's
# environment cannot import telefuser, and tests/unit/test_key_vocabulary.py keeps the two equal); letters in either
# case. Checked here so a typo in a trace fails before the run instead of as a 422 in the middle of it.
ALLOWED_KEYS = ("W", "S", "A", "D", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "J", "L", "I", "K")
_CANONICAL = {k.lower(): k for k in ALLOWED_KEYS}


@dataclass(frozen=True)
class ControlStep:
    number: int  # position in the trace, for messages
    keys: tuple[str, ...]
    delay_s: float | None = None
    after_chunk: int | None = None

    def describe(self) -> str:
        when = f"delay_s={self.delay_s:g}" if self.delay_s is not None else f"after_chunk={self.after_chunk}"
        return f"control #{self.number} ({when}, keys={list(self.keys)})"


def _step(number: int, raw: Any) -> ControlStep:
    if not isinstance(raw, dict):
        raise ValueError(f"control #{number}: expected an object, got {raw!r}")
    unknown = set(raw) - {"delay_s", "after_chunk", "keys", "note"}
    if unknown:
        raise ValueError(f"control #{number}: unknown field(s) {sorted(unknown)}")
    keys = raw.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"control #{number}: 'keys' must be a list of strings, got {keys!r}")
    canonical = []
    for key in keys:
        if key.lower() not in _CANONICAL:
            raise ValueError(f"control #{number}: unknown key {key!r}; allowed: {' '.join(ALLOWED_KEYS)}")
        canonical.append(_CANONICAL[key.lower()])
    delay, after = raw.get("delay_s"), raw.get("after_chunk")
    if (delay is None) == (after is None):
        raise ValueError(f"control #{number}: give exactly one of 'delay_s' and 'after_chunk'")
    if delay is not None and (not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0):
        raise ValueError(f"control #{number}: 'delay_s' must be a number >= 0, got {delay!r}")
    if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
        raise ValueError(f"control #{number}: 'after_chunk' must be an integer >= 0, got {after!r}")
    return ControlStep(number, tuple(canonical), float(delay) if delay is not None else None, after)


def parse_controls(spec: Any, base_dir: Path | None = None) -> list[ControlStep]:
    """A trace from a file path, a JSON string, a list of steps or a {"controls": [...]} object."""
    if spec is None or spec == "" or spec == []:
        return []
    if isinstance(spec, (str, Path)):
        text = str(spec).strip()
        if text.startswith(("[", "{")):
            spec = json.loads(text)
        else:
            path = Path(text)
            if not path.is_absolute() and base_dir is not None and not path.exists():
                path = base_dir / path
            spec = json.loads(path.read_text())
    if isinstance(spec, dict):
        spec = spec.get("controls")
    if not isinstance(spec, list):
        raise ValueError("a control trace is a list of steps or an object with a 'controls' list")
    return [_step(i, raw) for i, raw in enumerate(spec)]


def timed_steps(steps: Sequence[ControlStep]) -> list[ControlStep]:
    return sorted((s for s in steps if s.delay_s is not None), key=lambda s: (s.delay_s, s.number))


def chunk_steps(steps: Sequence[ControlStep], index: int) -> list[ControlStep]:
    return [s for s in steps if s.after_chunk == index]
