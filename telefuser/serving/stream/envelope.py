"""The binary WebSocket message that carries one chunk's frames: ``b"TFCH"``, a length-prefixed JSON header, the frames.

The layout and the per-frame CRC32 of the raw RGB (which lets a client prove it got the model's frames even through
lossy JPEG) are in PROTOCOL.md; why JPEG frames rather than an MP4 segment is in serving/README.md.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from typing import Any

import numpy as np

MAGIC = b"TFCH"
VERSION = 1
CODECS = ("jpeg", "png", "raw")


def encode_frame(frame: np.ndarray, codec: str, quality: int = 85) -> bytes:
    if codec == "raw":
        return np.ascontiguousarray(frame, dtype=np.uint8).tobytes()
    from PIL import Image

    buf = io.BytesIO()
    if codec == "jpeg":
        Image.fromarray(frame).save(buf, "JPEG", quality=quality)
    elif codec == "png":
        Image.fromarray(frame).save(buf, "PNG", compress_level=1)
    else:
        raise ValueError(f"unknown codec {codec!r}; use one of {', '.join(CODECS)}")
    return buf.getvalue()


def frame_crc32(frames: np.ndarray) -> list[int]:
    return [zlib.crc32(np.ascontiguousarray(f).tobytes()) for f in frames]


def chunk_checksum(frame_crcs: list[int]) -> str:
    """One checksum per chunk for tools (SSE): CRC32 over the per-frame CRC32s, as 8 hex digits."""
    return f"{zlib.crc32(struct.pack(f'>{len(frame_crcs)}I', *frame_crcs)):08x}"


def pack(header: dict[str, Any], images: list[bytes]) -> bytes:
    head = json.dumps({**header, "v": VERSION, "sizes": [len(b) for b in images]}, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack(">I", len(head)), head, *images])


def unpack(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """Split an envelope into its header and the encoded frames; ValueError when malformed."""
    if len(data) < 8 or data[:4] != MAGIC:
        raise ValueError("not a TFCH chunk envelope")
    (n,) = struct.unpack(">I", data[4:8])
    header = json.loads(data[8 : 8 + n])
    images, off = [], 8 + n
    for size in header["sizes"]:
        images.append(data[off : off + size])
        off += size
    if off != len(data) or len(images) != header["frames"]:
        raise ValueError(
            f"envelope size mismatch: header says {off} bytes / {header['frames']} frames, got {len(data)}"
        )
    return header, images


def decode_frames(header: dict[str, Any], images: list[bytes]) -> np.ndarray:
    """Decode an envelope's frames back to uint8 [F, H, W, 3] (tests and tools)."""
    h, w = header["height"], header["width"]
    if header["codec"] == "raw":
        return np.stack([np.frombuffer(b, np.uint8).reshape(h, w, 3) for b in images])
    from PIL import Image

    return np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in images])
