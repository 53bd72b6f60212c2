"""The control trace file: which keys are held from which chunk on (the key vocabulary is the model's,
`telefuser.models.lingbot_world_v2.controls`).

An entry's keys apply from the next chunk and stay held until a later entry replaces them; the file format is in
this folder's README.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...models.lingbot_world_v2.controls import normalize_keys

ENTRY_FIELDS = ("chunk", "keys")


@dataclass(frozen=True)
class ControlEvent:
    chunk: int  # the chunk during which the keys were held; they take effect at chunk + 1
    keys: tuple[str, ...]


@dataclass(frozen=True)
class ControlTrace:
    events: tuple[ControlEvent, ...] = ()

    def keys_for(self, chunk_index: int) -> tuple[str, ...]:
        """Keys in effect while producing chunk `chunk_index`: the latest entry recorded before it."""
        keys: tuple[str, ...] = ()
        for event in self.events:
            if event.chunk >= chunk_index:
                break
            keys = event.keys
        return keys

    def as_list(self) -> list[dict]:
        return [{"chunk": e.chunk, "keys": list(e.keys)} for e in self.events]


def parse_control_trace(text: str, source: str = "<control trace>") -> ControlTrace:
    """Parse a JSON list or JSON lines; every error names the entry (and line) at fault."""
    stripped = text.strip()
    if not stripped:
        return ControlTrace()
    entries: list[tuple[str, object]] = []
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: not valid JSON ({exc})") from None
        entries = [(f"entry {i}", item) for i, item in enumerate(data)]
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entries.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{source}: line {number} is not valid JSON ({exc})") from None
    events: list[ControlEvent] = []
    for where, item in entries:
        event = _event(item, f"{source}: {where}")
        if events and event.chunk <= events[-1].chunk:
            raise ValueError(
                f"{source}: {where}: chunk {event.chunk} does not come after chunk {events[-1].chunk} "
                f"(entries must be in strictly increasing chunk order)"
            )
        events.append(event)
    return ControlTrace(tuple(events))


def load_control_trace(path: str | Path) -> ControlTrace:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read control trace {path}: {exc}") from None
    return parse_control_trace(text, str(path))


def _event(item: object, where: str) -> ControlEvent:
    if not isinstance(item, dict):
        raise ValueError(f'{where}: expected an object like {{"chunk": 1, "keys": ["W"]}}, got {item!r}')
    unknown = sorted(set(item) - set(ENTRY_FIELDS))
    missing = [f for f in ENTRY_FIELDS if f not in item]
    if unknown or missing:
        raise ValueError(f"{where}: fields must be exactly {list(ENTRY_FIELDS)} (missing {missing}, unknown {unknown})")
    chunk = item["chunk"]
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 0:
        raise ValueError(f"{where}: chunk must be an integer >= 0, got {chunk!r}")
    if not isinstance(item["keys"], list):
        raise ValueError(f"{where}: keys must be a list, got {item['keys']!r}")
    try:
        keys = normalize_keys(item["keys"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return ControlEvent(chunk, keys)
