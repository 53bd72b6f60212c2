"""The stream service's settings for every session it runs: the CLI's flags, checked once."""

from __future__ import annotations

from dataclasses import dataclass

DELIVERY_MODES = ("lossless", "realtime")


@dataclass
class StreamSettings:
    max_sessions: int = 1
    delivery_mode: str = "lossless"
    buffer_chunks: int = 4  # chunks queued between the generator and the client
    codec: str = "jpeg"  # default frame codec of the binary envelope
    jpeg_quality: int = 85
    ack_timeout_s: float = 10.0  # how long to wait for the client's delivery_ack after done
    idle_timeout_s: float = 120.0  # a session nobody attaches to within this is closed
    keepalive_s: float = 15.0  # SSE comment interval
    max_body_bytes: int = 32 << 20
    finished_history: int = 256  # closed sessions kept for status / late acks
    max_frames: int | None = None  # an open-ended session ends (reason "frame_limit") once it has made this many
    max_notices: int = 64  # status events queued for one consumer; more are dropped (a client that never reads)
    keys: tuple[str, ...] = ()  # the control keys the model takes (its metadata's key_bindings), in its order

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.buffer_chunks < 1:
            raise ValueError(f"buffer_chunks must be >= 1, got {self.buffer_chunks}")
        if self.delivery_mode not in DELIVERY_MODES:
            raise ValueError(f"delivery_mode must be one of {DELIVERY_MODES}, got {self.delivery_mode!r}")
