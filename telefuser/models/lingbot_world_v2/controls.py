"""LingBot-World v2's control vocabulary, in one place: the keys a client may hold and the camera action of each.

The reference's keys: W/S move forward/back, A/D strafe, J/L turn (yaw), I/K look up/down (pitch). A client may
also send the DOM codes (``KeyW`` ... ``KeyL``) and the arrows, which act as in the public service: up/down move,
left/right turn. Letters are accepted in either case. The pipelines, the camera maths and the stream service all
read this table (the service through its model adapter's metadata).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

# Canonical keys in vocabulary order, each with the camera action it drives.
KEY_ACTIONS = MappingProxyType({
    "W": "forward", "A": "strafe_left", "S": "backward", "D": "strafe_right",
    "I": "pitch_up", "J": "yaw_left", "K": "pitch_down", "L": "yaw_right",
})  # fmt: skip
CONTROL_KEYS: tuple[str, ...] = tuple(KEY_ACTIONS)
# Other names for the canonical keys: the arrows and the DOM codes.
KEY_ALIASES = MappingProxyType({
    "ArrowUp": "W", "ArrowDown": "S", "ArrowLeft": "J", "ArrowRight": "L",
    **{f"Key{k}": k for k in CONTROL_KEYS},
})  # fmt: skip
# What a key-pressing client (a web page) sends, with the action each drives: the letters and the arrows.
KEY_BINDINGS = MappingProxyType({
    "W": "forward", "S": "backward", "A": "strafe_left", "D": "strafe_right",
    "ArrowUp": "forward", "ArrowDown": "backward", "ArrowLeft": "yaw_left", "ArrowRight": "yaw_right",
    "J": "yaw_left", "L": "yaw_right", "I": "pitch_up", "K": "pitch_down",
})  # fmt: skip
ACCEPTED_KEYS: tuple[str, ...] = (
    *CONTROL_KEYS,
    *(f"Key{k}" for k in CONTROL_KEYS),
    "ArrowUp",
    "ArrowDown",
    "ArrowLeft",
    "ArrowRight",
)
_BY_FOLDED_NAME = {name.upper(): KEY_ALIASES.get(name, name) for name in ACCEPTED_KEYS}


def canonical_key(name: str) -> str | None:
    """The canonical key a name stands for (``"arrowup"`` -> ``"W"``), or None when it is not a control key."""
    return _BY_FOLDED_NAME.get(name.strip().upper()) if isinstance(name, str) else None


def normalize_keys(keys: Iterable[str] | None) -> tuple[str, ...]:
    """Canonical key tuple (aliases resolved, duplicates dropped, vocabulary order); ValueError naming an unknown key."""
    if keys is None:
        return ()
    if isinstance(keys, str):
        raise ValueError(f"keys must be a list of key names, not the string {keys!r}")
    found = set()
    for key in keys:
        if not isinstance(key, str):
            raise ValueError(f"a control key must be a string, got {key!r}")
        canonical = canonical_key(key)
        if canonical is None:
            raise ValueError(
                f"unknown control key {key!r}; known keys: {', '.join(CONTROL_KEYS)} "
                f"(also KeyW..KeyL and ArrowUp/ArrowDown/ArrowLeft/ArrowRight)"
            )
        found.add(canonical)
    return tuple(k for k in CONTROL_KEYS if k in found)
