"""What a session hands its consumer (WebSocket, SSE or WebRTC), and how a model chunk becomes one: the wire items
whose payloads PROTOCOL.md describes, built in a worker thread (checked, checksummed, encoded)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .contract import StreamSession
from .envelope import chunk_checksum, encode_frame, frame_crc32, pack


@dataclass
class ChunkItem:
    index: int
    first_frame: int
    frames: int
    width: int
    height: int
    measurement: dict[str, Any]
    checksum: str
    frame_crc32: list[int]
    codec: str | None  # None: the consumer wants events only, frames were not encoded
    images: list[bytes] | None
    encode_seconds: float
    control: dict[str, Any] | None = None  # {"generation", "seq"} of the held keys the chunk was computed under
    pixels: np.ndarray | None = None  # uint8 [F, H, W, 3], for a consumer that encodes video itself (WebRTC)
    computed_at: float | None = None  # wall clock (epoch ms) when the model's chunk was ready, before encoding

    def envelope(self, fps: float) -> bytes:
        header = {
            "chunk": self.index,
            "first_frame": self.first_frame,
            "frames": self.frames,
            "width": self.width,
            "height": self.height,
            "fps": fps,
            "codec": self.codec,
            "crc32": self.frame_crc32,
            **self.control_fields(),
            **self.computed_fields(),
        }
        return pack(header, self.images or [])

    def control_fields(self) -> dict[str, Any]:
        control = self.control or {}
        return {"control_generation": control.get("generation", 0), "control_seq": control.get("seq")}

    def computed_fields(self) -> dict[str, Any]:
        """`computed_at` (PROTOCOL.md, "Measuring the transport overhead"); absent when not stamped."""
        return {} if self.computed_at is None else {"computed_at": round(self.computed_at, 3)}


@dataclass
class DoneItem:
    reason: str  # "completed" | "stopped"
    chunks: int


@dataclass
class Notice:
    payload: dict[str, Any]
    final: bool = False  # the consumer stops after sending it (closed, fatal error)


KEEPALIVE = object()


def next_chunk_stamped(model: StreamSession, keys: list[str]) -> tuple[Any, float]:
    """The model's next chunk and the wall clock (epoch ms) when it was ready, taken in the worker thread that computed
    it: the start of the transport overhead a client measures (PROTOCOL.md, "Measuring the transport overhead")."""
    chunk = model.next_chunk(keys)
    return chunk, time.time() * 1000


def prepare_chunk(
    chunk: Any, index: int, first_frame: int, codec: str | None, quality: int, wall: float, keep_pixels: bool = False
) -> ChunkItem:
    """Check a model chunk, checksum it and encode its frames (runs in a worker thread); `keep_pixels` keeps the
    frames themselves for a consumer that encodes video itself."""
    frames = chunk.frames
    if getattr(chunk, "index", index) != index:
        raise ValueError(f"model returned chunk {chunk.index} where chunk {index} was expected")
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError(
            f"chunk {index}: frames must be uint8 [F, H, W, 3], got {getattr(frames, 'dtype', type(frames))} "
            f"{tuple(getattr(frames, 'shape', ()))}"
        )
    t0 = time.perf_counter()
    crcs = frame_crc32(frames)
    images = [encode_frame(f, codec, quality) for f in frames] if codec else None
    measurement = dict(chunk.measurement or {})
    measurement.setdefault("index", index)
    measurement.setdefault("frames", int(frames.shape[0]))
    measurement.setdefault("compute_seconds", wall)
    measurement.setdefault("phases", {})
    return ChunkItem(
        index=index,
        first_frame=first_frame,
        frames=int(frames.shape[0]),
        width=int(frames.shape[2]),
        height=int(frames.shape[1]),
        measurement=measurement,
        checksum=chunk_checksum(crcs),
        frame_crc32=crcs,
        codec=codec,
        images=images,
        encode_seconds=time.perf_counter() - t0,
        pixels=frames if keep_pixels else None,
    )
