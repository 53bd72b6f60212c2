"""A fake world model for tests and the `--fake` demo: deterministic frames, real chunk timing rules.

Chunks have LingBot-World v2's shape (13 frames, then 16). Each frame shows the uploaded image panned by the held
keys, the global frame number and the chunk index as block digits, and a lit square per held key, so a viewer or a
test can see order, controls and gaps; `pattern="noise"` gives incompressible seeded noise (backpressure tests).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import deque
from typing import Any

import numpy as np

from ..common.request_body import short_repr
from .contract import Chunk, parse_resolution

FRAME_POLICIES = ("strict", "truncate")  # the model it stands in for, LingBot-World v2, takes these

_FONT = {  # 3x5 block digits
    "0": ("111", "101", "101", "101", "111"),
    "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"),
    "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"),
    "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"),
    "7": ("111", "001", "010", "010", "010"),
    "8": ("111", "101", "111", "101", "111"),
    "9": ("111", "101", "111", "001", "111"),
}
# The controls it declares (LingBot-World v2's, which it imitates): each key's action, and the pose change per frame
# while it is held, (dx, dy) pan in pixels for moves and the same axes for yaw/pitch.
_CONTROLS = {
    "W": ("forward", (0, 2)), "S": ("backward", (0, -2)), "A": ("strafe_left", (2, 0)), "D": ("strafe_right", (-2, 0)),
    "ArrowUp": ("forward", (0, 2)), "ArrowDown": ("backward", (0, -2)),
    "ArrowLeft": ("yaw_left", (4, 0)), "ArrowRight": ("yaw_right", (-4, 0)),
    "J": ("yaw_left", (4, 0)), "L": ("yaw_right", (-4, 0)), "I": ("pitch_up", (0, 4)), "K": ("pitch_down", (0, -4)),
}  # fmt: skip
KEY_BINDINGS = {key: action for key, (action, _) in _CONTROLS.items()}
ALLOWED_KEYS = tuple(KEY_BINDINGS)


def draw_number(img: np.ndarray, text: str, x: int, y: int, scale: int) -> None:
    """Draw digits in white on a black box at (x, y), in place, clipped to the image."""
    h, w = img.shape[:2]
    box_w, box_h = (4 * len(text) + 1) * scale, 7 * scale
    img[max(0, y) : min(h, y + box_h), max(0, x) : min(w, x + box_w)] = 0
    for i, ch in enumerate(text):
        for r, row in enumerate(_FONT[ch]):
            for c, bit in enumerate(row):
                if bit == "1":
                    y0, x0 = y + (r + 1) * scale, x + (1 + 4 * i + c) * scale
                    img[max(0, y0) : min(h, y0 + scale), max(0, x0) : min(w, x0 + scale)] = 255


def frames_for_chunk(counts: tuple[int, int], index: int) -> int:
    first, later = counts
    return first if index == 0 else later


class FakeSession:
    """One fake world. Records every next_chunk call (index, keys, per-frame CRC32) in `history`."""

    def __init__(self, factory: FakeSessionFactory, number: int, image: np.ndarray, prompt: str, config: dict):
        self.factory, self.number, self.prompt, self.config = factory, number, prompt, dict(config)
        self.width, self.height = parse_resolution(config["resolution"])
        self.fps = config["fps"]
        self.seed = int(config.get("seed", 0))
        num_frames = config.get("num_frames")
        if num_frames is None:
            self.total_chunks, self.total_frames = None, None
        else:
            first, later = factory.chunk_frames
            self.total_chunks = 1 + (num_frames - first) // later
            self.total_frames = first + (self.total_chunks - 1) * later
        self.base = _fit(image, self.width, self.height) if factory.pattern == "scene" else None
        self.pan = [0, 0]
        self.next_index = 0
        self.frame_number = 0
        self.history: list[dict[str, Any]] = []
        self.closed = False
        self.close_calls = 0

    def next_chunk(self, keys: list[str]) -> Chunk:
        if self.closed:
            raise RuntimeError(f"fake session {self.number} is closed")
        if self.total_chunks is not None and self.next_index >= self.total_chunks:
            raise RuntimeError(f"fake session {self.number} has no chunk {self.next_index}")
        index, keys = self.next_index, list(keys)
        self.factory._log(("next_chunk", self.number, index, tuple(keys)))
        t0 = time.perf_counter()
        if self.factory.delay_s:
            time.sleep(self.factory.delay_s)
        t1 = time.perf_counter()
        count = frames_for_chunk(self.factory.chunk_frames, index)
        frames = np.stack([self._frame(index, keys) for _ in range(count)])
        t2 = time.perf_counter()
        self.next_index += 1
        crcs = [zlib.crc32(f.tobytes()) for f in frames]
        self.history.append({"index": index, "keys": keys, "frames": count, "crc32": crcs})
        measurement = {
            "index": index,
            "frames": count,
            "compute_seconds": t2 - t0,
            "phases": {"denoise": t1 - t0, "decode": t2 - t1},
        }
        return Chunk(index=index, frames=frames, measurement=measurement)

    def _frame(self, index: int, keys: list[str]) -> np.ndarray:
        n = self.frame_number
        self.frame_number += 1
        if self.factory.pattern == "noise":
            rng = np.random.default_rng(self.seed * 1_000_003 + n)
            return rng.integers(0, 256, (self.height, self.width, 3), dtype=np.uint8)
        for key in keys:
            dx, dy = _CONTROLS[key][1]
            self.pan[0] += dx
            self.pan[1] += dy
        img = np.roll(self.base, shift=(self.pan[1] % self.height, self.pan[0] % self.width), axis=(0, 1))
        scale = max(1, self.height // 48)
        draw_number(img, str(n), scale, scale, scale)
        text = str(index)
        draw_number(img, text, self.width - (4 * len(text) + 2) * scale, scale, scale)
        size = 3 * scale
        for i, key in enumerate(ALLOWED_KEYS):  # one square per key along the bottom edge, lit while held
            x0, y0 = scale + i * (size + scale), self.height - size - scale
            img[max(0, y0) : y0 + size, x0 : x0 + size] = (255, 200, 0) if key in keys else (40, 40, 40)
        return img

    def close(self) -> None:
        self.close_calls += 1
        self.closed = True
        self.base = None
        self.factory._closed(self)


class FakeSessionFactory:
    """Deterministic stand-in for the real model (see module docstring); thread-safe; counts open sessions."""

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        chunk_frames: tuple[int, int] = (13, 16),
        defaults: dict[str, Any] | None = None,
        max_sessions: int = 4,
        pattern: str = "scene",
        keep_sessions: bool = True,
    ):
        if pattern not in ("scene", "noise"):
            raise ValueError(f"pattern must be 'scene' or 'noise', got {pattern!r}")
        self.delay_s, self.chunk_frames, self.pattern, self.keep_sessions = (
            delay_s,
            chunk_frames,
            pattern,
            keep_sessions,
        )
        self.defaults = {"seed": 42, "resolution": "832x480", "num_frames": 77, "fps": 16, "frame_policy": "truncate"}
        self.defaults.update(defaults or {})
        self.metadata = {
            "model": "fake (deterministic test pattern)",
            "weights": "none (fake model)",
            "native_resolution": "832x480",  # LingBot-World v2's canvas, which the fake imitates
            "device": "cpu",
            "resolutions": ["832x480", "640x368", "416x240", "320x192"],
            "fps": self.defaults["fps"],
            "max_sessions": max_sessions,
            "chunk_frames": {"first": chunk_frames[0], "later": chunk_frames[1]},
            "frame_rule": f"num_frames = {chunk_frames[0]} + {chunk_frames[1]}k (truncate rounds down)",
            "defaults": dict(self.defaults),
            "key_bindings": dict(KEY_BINDINGS),
        }
        self._lock = threading.Lock()
        self.calls: deque = deque(
            maxlen=100_000
        )  # ("create", n, prompt, crc) / ("next_chunk", n, i, keys) / ("close", n)
        self.sessions: list[FakeSession] = []
        self.created = 0
        self.open_sessions = 0

    def validate(self, image: np.ndarray, prompt: str, config: dict[str, Any]) -> None:
        width, height = parse_resolution(config["resolution"])
        if width % 8 or height % 8 or not (16 <= width <= 1920 and 16 <= height <= 1920):
            raise ValueError(
                f"resolution {width}x{height} is not supported: width and height must be multiples of 8 in [16, 1920]"
            )
        num_frames, policy = config.get("num_frames"), config.get("frame_policy", "truncate")
        if policy not in FRAME_POLICIES:
            raise ValueError(f"frame_policy must be one of {', '.join(FRAME_POLICIES)}, got {short_repr(policy)}")
        first, later = self.chunk_frames
        if num_frames is not None:
            if num_frames < first:
                raise ValueError(f"num_frames {num_frames} is fewer than one chunk ({first} frames)")
            if policy == "strict" and (num_frames - first) % later:
                nearest = num_frames - (num_frames - first) % later
                raise ValueError(
                    f"num_frames {num_frames} is not {first} + {later}k; use e.g. {nearest} or frame_policy 'truncate'"
                )
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"image must be uint8 HxWx3, got {image.dtype} {tuple(image.shape)}")

    def memory_estimate(self, config: dict[str, Any]) -> dict[str, int]:
        """The scene it pans (one frame) and a chunk of frames with its rolled copies."""
        width, height = parse_resolution(config["resolution"])
        frame = width * height * 3
        return {"scene": frame, "chunk frames": 2 * max(self.chunk_frames) * frame}

    def create(self, image: np.ndarray, prompt: str, config: dict[str, Any]) -> FakeSession:
        self.validate(image, prompt, config)
        with self._lock:
            number = self.created
            self.created += 1
            self.open_sessions += 1
            self.calls.append(("create", number, prompt, zlib.crc32(image.tobytes()), tuple(sorted(config.items()))))
        session = FakeSession(self, number, image, prompt, config)
        if self.keep_sessions:
            self.sessions.append(session)
        return session

    def _log(self, entry: tuple) -> None:
        with self._lock:
            self.calls.append(entry)

    def _closed(self, session: FakeSession) -> None:
        with self._lock:
            self.calls.append(("close", session.number))
            self.open_sessions -= 1


def _fit(image: np.ndarray, width: int, height: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(image).convert("RGB").resize((width, height), Image.BILINEAR)).copy()
