"""`serve-stream --webrtc` options, and the check that aiortc is installed (an optional dependency)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CODECS = ("vp8", "h264")
DEFAULT_MAX_BITRATE = 8_000_000  # bits per second, the seed's LiveKit cap


@dataclass(frozen=True)
class WebRtcSettings:
    codec: str = "vp8"
    max_bitrate: int = DEFAULT_MAX_BITRATE
    keyframe_interval_s: float = 2.0  # a lost packet heals at the next keyframe (the track sends encoded frames)
    ice_servers: tuple[dict[str, Any], ...] = field(default_factory=tuple)  # browser RTCIceServer dicts (STUN/TURN)
    connect_timeout_s: float = 30.0  # the data channel must open within this after the answer

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"WebRTC codec must be one of {', '.join(CODECS)}, got {self.codec!r}")
        if not 100_000 <= self.max_bitrate <= 100_000_000:
            raise ValueError(f"WebRTC bitrate cap must be within 0.1..100 Mbit/s, got {self.max_bitrate / 1e6:g}")

    def describe(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "codec": self.codec,
            "max_bitrate": self.max_bitrate,
            "keyframe_interval_s": self.keyframe_interval_s,
            "ice_servers": len(self.ice_servers),
        }


def missing_dependency() -> str | None:
    """Why --webrtc cannot run here, or None."""
    try:
        import aiortc  # noqa: F401
    except ImportError as exc:
        return f"--webrtc needs aiortc, which is not installed ({exc}); pip install 'aiortc>=1.14'"
    return None


def load_ice_servers(path: str | Path) -> tuple[dict[str, Any], ...]:
    """A JSON list of RTCIceServer objects as a browser takes them: [{"urls": "turn:host:3478", "username": ...,
    "credential": ...}]. ValueError names what is wrong."""
    try:
        servers = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--webrtc-ice-servers {path}: {exc}") from None
    if not isinstance(servers, list):
        raise ValueError(f"--webrtc-ice-servers {path}: expected a JSON list of {{'urls': ...}} objects")
    for server in servers:
        urls = server.get("urls") if isinstance(server, dict) else None
        if not (isinstance(urls, str) or (isinstance(urls, list) and all(isinstance(u, str) for u in urls))):
            raise ValueError(f"--webrtc-ice-servers {path}: every entry needs 'urls' (a string or a list of them)")
        unknown = set(server) - {"urls", "username", "credential"}
        if unknown:
            raise ValueError(f"--webrtc-ice-servers {path}: unknown key(s) {sorted(unknown)}")
    return tuple(servers)
