"""The binary WebSocket message that carries one chunk's frames.

Layout (all integers big-endian)::

    0      4 bytes   magic b"TFCH"
    4      4 bytes   uint32 N = length of the JSON header
    8      N bytes   UTF-8 JSON header:
                     {"v": 1, "chunk": i, "first_frame": n, "frames": F, "width": W, "height": H, "fps": fps,
                      "codec": "jpeg" | "png" | "raw", "sizes": [bytes of frame 0, ...], "crc32": [per frame ...]}
    8+N    ...       the F encoded frames back to back, frame k is `sizes[k]` bytes

`crc32` is zlib.crc32 of each frame's raw RGB24 bytes *before* encoding, so a client can prove it got the frames the
model produced even through lossy JPEG. "jpeg"/"png" frames are whole image files (the browser decodes them with
createImageBitmap); "raw" frames are H*W*3 bytes of RGB24, row-major.

JPEG frames were chosen over an MP4 segment because every frame is independently decodable, the page needs no
MSE/codec negotiation, and the page can play at exactly the model's FPS from its own buffer.
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
