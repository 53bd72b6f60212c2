"""The contract between the streaming service and a model: sessions that produce chunks of frames.

The service only ever talks to these two protocols, so the HTTP/WebSocket layer is tested against a fake and the
real LingBot-World v2 pipeline plugs in through a thin adapter. The model names its own keyboard controls in its
metadata (`key_bindings`); the service has no key table of its own. Everything here is a constant or a pure function.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from telefuser.pipelines.chunk import Chunk  # what next_chunk returns: frames uint8 [F, H, W, 3], measurement

from ..common.request_body import MAX_SEED, short_repr

# The request config keys every session model takes, checked here; a model adds its own (its metadata's `defaults`
# name every key it takes) and checks their values in `validate`. Anything else is rejected: typos never pass.
COMMON_CONFIG_KEYS: tuple[str, ...] = ("seed", "resolution", "num_frames", "fps")
_RESOLUTION = re.compile(r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$")


@runtime_checkable
class StreamSession(Protocol):
    """One user's world: a KV-cache slot, with the prompt and image encoded once at creation."""

    total_chunks: int | None  # None = open-ended

    def next_chunk(self, keys: list[str]) -> Chunk:
        """Compute the next chunk (blocking); `keys` are the controls held when it started."""

    def close(self) -> None:
        """Free the KV slot; called exactly once, never while next_chunk runs."""


@runtime_checkable
class SessionFactory(Protocol):
    # model, weights, resolutions, fps, max_sessions, defaults (a full config), and key_bindings: the keyboard
    # controls it takes, {key: action}, each key as a browser names it (KeyboardEvent.key for the arrows, upper-case
    # letters), in the order a client shows them. A session's next_chunk receives the held keys by those names.
    metadata: dict[str, Any]

    def validate(self, image: np.ndarray, prompt: str, config: dict[str, Any]) -> None:
        """Raise ValueError with a user-facing message when the request cannot run."""

    def create(self, image: np.ndarray, prompt: str, config: dict[str, Any]) -> StreamSession: ...

    # Optional: `memory_estimate(config) -> {term: bytes}` (latents, KV window, activations, decode...) for a
    # validated config; with it the service refuses sessions that cannot fit the device (limits.py).
    # Optional metadata: "native_resolution" (the canvas the model was trained at), "device", "chunk_frames".


def parse_resolution(value: Any) -> tuple[int, int]:
    """'832x480' -> (832, 480); ValueError with the accepted form otherwise."""
    match = _RESOLUTION.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"resolution must be a string 'WIDTHxHEIGHT' such as '832x480', got {short_repr(value)}")
    return int(match.group(1)), int(match.group(2))


def config_keys(metadata: dict[str, Any] | None) -> tuple[str, ...]:
    """The config keys a model takes: the common ones, then the rest of its metadata's `defaults` (a full config)."""
    defaults = (metadata or {}).get("defaults") or {}
    return COMMON_CONFIG_KEYS + tuple(key for key in defaults if key not in COMMON_CONFIG_KEYS)


def check_config(config: Any, allowed: Sequence[str] = COMMON_CONFIG_KEYS) -> dict[str, Any]:
    """Model-independent checks of a request config: keys in `allowed` (`config_keys` of the model) and sane types
    for the common ones. Returns a copy."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be a JSON object, got {type(config).__name__}")
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        named = ", ".join(short_repr(key, 40) for key in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise ValueError(f"unknown config key(s) {named}; allowed: {', '.join(allowed)}")
    out = dict(config)
    if "seed" in out and (
        not isinstance(out["seed"], int) or isinstance(out["seed"], bool) or not 0 <= out["seed"] <= MAX_SEED
    ):
        raise ValueError(f"seed must be an integer between 0 and {MAX_SEED}, got {short_repr(out['seed'])}")
    if "resolution" in out:
        parse_resolution(out["resolution"])
    if "num_frames" in out and out["num_frames"] is not None:
        n = out["num_frames"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(
                f"num_frames must be a positive integer (or null for an open-ended stream), got {short_repr(n)}"
            )
    if "fps" in out:
        fps = out["fps"]
        if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not 0 < fps <= 120:
            raise ValueError(f"fps must be a number in (0, 120], got {short_repr(fps)}")
    return out


def key_bindings(metadata: dict[str, Any] | None) -> dict[str, str]:
    """A model's {key: action} controls from its metadata, in its order; empty when it takes none."""
    return dict((metadata or {}).get("key_bindings") or {})


def check_client_keys(keys: Any, allowed: Sequence[str]) -> list[str]:
    """Validate a control message's keys against the model's `allowed` keys; letters are case-insensitive. Returns
    them in the model's order, de-duplicated."""
    if not isinstance(keys, list):
        raise ValueError(f"'keys' must be a list of key names, got {type(keys).__name__}")
    out = set()
    for key in keys:
        name = key.upper() if isinstance(key, str) and len(key) == 1 else key
        if not isinstance(name, str) or name not in allowed:
            raise ValueError(f"unknown key {short_repr(key)}; allowed keys: {', '.join(allowed)}")
        out.add(name)
    return sorted(out, key=list(allowed).index)
