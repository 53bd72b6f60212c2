"""Steady LingBot chunks as CUDA graphs (`torch.cuda.CUDAGraph`), on KV-window buffers that outlive their windows.

Once a window's length is known, every forward of a chunk (its denoising steps and its KV commit) launches
the same kernels on the same buffers; only data changes: the latents, the timestep, the RoPE angles, the camera
modulation, the ring slots the chunk's K/V go to (device data: `WindowSlots.slot_rows`) and the running max |V| of an
FP8 window (device state). So each forward kind (read-only or commit) and window length is captured once per buffer
set and then replayed: the host enqueues one graph instead of the forward's kernels and compiled-code wrappers.

- **Pool.** A graph keeps the addresses it was captured with, so the window buffers it reads and writes (every
  layer's state in the window's format: its K/V, the prompt's K/V, an FP8 or sage window's numbers: `WindowBuffers`)
  come from a pool of this object's and go back to it when the window closes; the next window of the same shape and
  format adopts them (the format's `load`: its prompt copied in, the rest reset) and replays the graphs already
  captured for them. Each entry also holds the static copies of the forward's inputs and the captured graphs.
- **Capture.** The first call of a (kind, window length) on an entry runs eagerly on the entry's static inputs, and
  its result is the call's result: torch.compile's kernels, cuDNN's plans and the Ulysses communicator's eager group at these shapes exist
  afterwards. Then the same call is captured (capture runs no kernel, so the window's state is unchanged) on the
  entry's static inputs; later calls copy their inputs there and replay. A service's warm-up session therefore
  captures every graph a client will replay.
- **Exactness.** A replay runs the kernels of the eager call on the same buffers: its outputs, and every buffer it
  writes, are bit-identical to the eager forward's (tests/gpu/test_lingbot_graphs_cuda.py checks whole sessions).

All captures share one memory pool: forwards run one at a time (one stream; the services serialise chunks), and a
graph's outputs and static inputs stay referenced here, so no capture reuses them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch.utils._pytree import tree_map

from .window_formats import WindowBuffers


class ChunkData(NamedTuple):
    """A forward's device inputs: what changes between replays of one graph (copied into its static twin). `cos`,
    `sin`, `slots` and `camera` are per-chunk tensors that nobody writes after handing them over: the same object is
    not copied again for the chunk's next forward."""

    latents: torch.Tensor  # [B, in_dim, F, h, w]
    t: torch.Tensor  # [B] on the device
    cos: torch.Tensor  # RoPE of the chunk's rows
    sin: torch.Tensor
    slots: torch.Tensor  # int64 [n]: the buffer row of each chunk row
    camera: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None  # every block's (scale, shift), or None


def _described(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype)


def signature(data: ChunkData) -> tuple:
    """Shapes and dtypes of every input: inputs of one signature share static buffers. Every block's camera
    modulation has one shape (one projection of the same tokens), so the first pair stands for all of them; `_copy_in`
    checks each pair when it copies a new modulation. Written out field by field: it runs on every replay."""
    camera = data.camera
    camera_sig = None if camera is None else (len(camera), _described(camera[0][0]), _described(camera[0][1]))
    return (
        _described(data.latents),
        _described(data.t),
        _described(data.cos),
        _described(data.sin),
        _described(data.slots),
        camera_sig,
    )


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor | None


def _dead() -> None:
    return None


@dataclass
class _Static:
    data: ChunkData
    camera_source: Callable[[], object | None] = _dead  # weakref to the camera modulation copied in
    sources: dict[str, Callable[[], object | None]] = field(default_factory=dict)  # weakrefs to cos, sin, slots


@dataclass
class PoolEntry:
    """One set of window buffers and what was captured on it."""

    key: Hashable
    buffers: WindowBuffers
    statics: dict[tuple, _Static] = field(default_factory=dict)
    graphs: dict[Hashable, _Captured] = field(default_factory=dict)
    in_use: bool = False


class ChunkGraphs:
    """The pool of window buffers of one model and the graphs captured on them (see the module docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: list[PoolEntry] = []
        self._mempool = None
        self.captures = 0  # graphs captured so far (tests and benches read it)
        self.replays = 0

    # -- the pool ----------------------------------------------------------------------------------------------------
    def takes(self, device: torch.device) -> bool:
        """Whether windows on `device` get pooled buffers and graphs: CUDA devices."""
        return device.type == "cuda"

    def acquire(self, key: Hashable, allocate: Callable[[], WindowBuffers]) -> PoolEntry:
        """A free entry of `key` (the window's shapes), or a new one with `allocate()`'s buffers."""
        with self._lock:
            for entry in self._entries:
                if entry.key == key and not entry.in_use:
                    entry.in_use = True
                    return entry
        entry = PoolEntry(key, allocate(), in_use=True)
        with self._lock:
            self._entries.append(entry)
        return entry

    def release(self, entry: PoolEntry) -> None:
        entry.in_use = False

    @property
    def entries(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every free entry, its buffers and graphs (entries in use stay)."""
        with self._lock:
            self._entries = [e for e in self._entries if e.in_use]

    def forget_captures(self) -> None:
        """Drop every captured graph (the buffers stay): the next call of each key captures again."""
        with self._lock:
            for entry in self._entries:
                entry.graphs.clear()

    # -- capture and replay --------------------------------------------------------------------------------------------
    def run(
        self,
        entry: PoolEntry,
        key: Hashable,
        data: ChunkData,
        program: Callable[[ChunkData], torch.Tensor | None],
        camera_source: object | None,
    ) -> torch.Tensor | None:
        """``program(data)``: eagerly and then captured the first time `key` meets this entry, replayed after.
        `program` may read `data` and the entry's buffers only (everything else it uses must be the same for every
        call of `key`). `camera_source` is the object `data.camera` came from: the same object is not copied again."""
        sig = signature(data)
        key = (sig, key)
        static = entry.statics.get(sig)
        captured = entry.graphs.get(key)
        if captured is None:
            # Eagerly on the static inputs first: anything compiled or autotuned for their exact layout (Inductor
            # autotunes a kernel at its first launch, which a capture cannot record) happens here, not in the capture.
            static = self._fill(entry, data, camera_source)
            output = program(static.data)
            entry.graphs[key] = self._capture(static.data, program)
            return output
        self._copy_in(static, data, camera_source)
        captured.graph.replay()
        self.replays += 1
        return None if captured.output is None else captured.output.clone()

    def _fill(self, entry: PoolEntry, data: ChunkData, camera_source) -> _Static:
        sig = signature(data)
        static = entry.statics.get(sig)
        if static is None:
            static = entry.statics[sig] = _Static(tree_map(lambda t: torch.empty_like(t), data))
        self._copy_in(static, data, camera_source)
        return static

    @staticmethod
    def _copy_in(static: _Static, data: ChunkData, camera_source) -> None:
        own = static.data
        own.latents.copy_(data.latents)
        own.t.copy_(data.t)
        for name in ("cos", "sin", "slots"):  # a chunk's forwards pass the same (cached, never written) tensors
            source = getattr(data, name)
            if static.sources.get(name, _dead)() is not source:
                getattr(own, name).copy_(source)
                static.sources[name] = weakref.ref(source)
        if data.camera is None or (camera_source is not None and static.camera_source() is camera_source):
            return  # the chunk's modulation is copied once, not once per forward
        for dst_pair, src_pair in zip(own.camera, data.camera, strict=True):
            for dst, src in zip(dst_pair, src_pair, strict=True):
                if dst.shape != src.shape:  # copy_ would broadcast a smaller one silently
                    raise ValueError(f"camera modulation of shape {tuple(src.shape)}, captured {tuple(dst.shape)}")
                dst.copy_(src)
        if camera_source is not None:
            static.camera_source = weakref.ref(camera_source)

    def _capture(self, data: ChunkData, program: Callable) -> _Captured:
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a service's other threads may touch CUDA meanwhile (they never use this stream)
        with torch.cuda.graph(graph, pool=self._mempool, capture_error_mode="thread_local"):
            output = program(data)
        self.captures += 1
        return _Captured(graph, output)
