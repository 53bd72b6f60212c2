"""Each chunk's frames decoded in a worker thread while the stream goes on, so decoding never delays a receive."""

from __future__ import annotations

import asyncio
import concurrent.futures
import zlib
from typing import Any

from telefuser.serving.stream.envelope import decode_frames

SETTLE_S = 120.0


def check_frames(header: dict[str, Any], images: list[bytes]) -> tuple[list[str], int, int]:
    """Decode a chunk's frames: (problems, frames decoded, CRC32s compared). Runs in a worker thread."""
    index = header.get("chunk")
    try:
        frames = decode_frames(header, images)
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds; an undecodable frame is a finding
        return [f"chunk {index}: its frames do not decode: {type(exc).__name__}: {exc}"], 0, 0
    want = (len(images), header["height"], header["width"], 3)
    if tuple(frames.shape) != want:
        return [f"chunk {index}: decoded frames are {tuple(frames.shape)}, the header says {want}"], len(frames), 0
    if header.get("codec") not in ("png", "raw"):
        return [], len(frames), 0  # jpeg is lossy: its crc32 is the model's raw frame, not what decodes
    crcs = [zlib.crc32(f.tobytes()) for f in frames]
    bad = [i for i, (a, b) in enumerate(zip(crcs, header.get("crc32") or [], strict=False)) if a != b]
    if bad or len(crcs) != len(header.get("crc32") or []):
        return [f"chunk {index}: frame(s) {bad[:5]} differ from the model's (CRC32 mismatch)"], len(frames), len(crcs)
    return [], len(frames), len(crcs)


class FrameChecks:
    def __init__(self, executor: concurrent.futures.Executor, enabled: bool):
        self.executor, self.enabled = executor, enabled
        self.futures: list[asyncio.Future] = []
        self.decoded = self.crc_checked = 0

    def submit(self, header: dict[str, Any], images: list[bytes]) -> None:
        if self.enabled:
            loop = asyncio.get_running_loop()
            self.futures.append(loop.run_in_executor(self.executor, check_frames, header, images))

    async def settle(self, timeout_s: float = SETTLE_S) -> list[str]:
        """Wait for the decodes; their problems (and a note for any that did not finish)."""
        if not self.futures:
            return []
        done, late = await asyncio.wait(self.futures, timeout=timeout_s)
        problems = [f"{len(late)} chunk(s) were still decoding after {timeout_s:g} s"] if late else []
        for future in done:
            if future.cancelled() or future.exception() is not None:
                problems.append(f"checking a chunk's frames failed: {future!r}")
                continue
            found, decoded, checked = future.result()
            problems += found
            self.decoded += decoded
            self.crc_checked += checked
        return problems
