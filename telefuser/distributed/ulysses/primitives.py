"""The device primitives the copy engine is written against: CUDA (tf-kernel) and their synchronous host twins.

`CudaPrimitives` submits a call's copies as one batch on a high-priority stream; `HostPrimitives` does the same on
CPU shared memory, so the engine's state machine runs unchanged in CI.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from .layout import PitchedCopy


def describe_phase(token: int) -> str:
    """A handshake phase named by its token (the copy engine counts phases from 1, two per group: open, close)."""
    return f"the {'open' if token % 2 else 'close'} phase of handshake group {(token + 1) // 2}"


class UlyssesTimeoutError(RuntimeError):
    """A peer did not complete a grouped handshake or a control exchange in time (it died, raised before submitting
    its part, or is running a different call sequence)."""


class HostGraph:
    """What a host capture recorded (`HostPrimitives.capture`): the steps, run again in order by `replay()`, as a CUDA
    graph replays its nodes on the buffers it captured. Tests add their own consumers with `add`."""

    def __init__(self):
        self.steps: list[Callable[[], None]] = []

    def add(self, step: Callable[[], None]) -> None:
        self.steps.append(step)

    def replay(self) -> None:
        for step in self.steps:
            step()


class HostPrimitives:
    """Synchronous stand-ins: copies happen at submission, a handshake phase spins on shared-memory flags. Under
    `capture()` they are recorded instead and run at each replay, so the protocol's replay behaviour runs in CI."""

    name = "host"

    def __init__(self, timeout_s: float, notices: Callable[[], str] | None = None):
        self.timeout_s = timeout_s
        self._notices = notices or (lambda: "")
        self._graph: HostGraph | None = None

    @contextlib.contextmanager
    def capture(self):
        if self._graph is not None:
            raise RuntimeError("a host capture is already under way")
        self._graph = HostGraph()
        try:
            yield self._graph
        finally:
            self._graph = None

    def capturing(self) -> bool:
        return self._graph is not None

    def _run(self, step: Callable[[], None]) -> None:
        if self._graph is not None:
            self._graph.add(step)
        else:
            step()

    def new_stream(self, high_priority: bool) -> None:
        return None

    def new_marker(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(2, dtype=dtype)

    def copy_list(self, peers: list, capacity: int, geometries) -> list:
        return [(peers[peer], capacity, pc) for peer, pc in geometries]

    def submit(self, src: torch.Tensor, copies: list, stream, ready: bool = True) -> None:
        def copy_all() -> None:
            for dst, capacity, pc in copies:
                self.copy_2d(src, dst, capacity, pc, stream)

        self._run(copy_all)

    def record_completion(self, stream) -> None:
        return None

    def caller_wait(self, event) -> None:
        return None

    def protect_input(self, tensor: torch.Tensor, stream) -> None:
        return None

    def synchronize(self, stream) -> None:
        return None

    def close(self) -> None:
        return None

    def copy_2d(self, src: torch.Tensor, dst: torch.Tensor, capacity: int, pc: PitchedCopy, stream) -> None:
        esize = src.element_size()
        flat = torch.as_strided(src, (src.untyped_storage().nbytes() // esize,), (1,), 0).view(torch.uint8)
        base = src.storage_offset() * esize
        last = pc.dst_offset + (pc.batch - 1) * pc.dst_batch_stride + (pc.height - 1) * pc.dst_pitch + pc.width
        if last > capacity:
            raise RuntimeError(f"copy_2d: write ends at byte {last}, past the destination's {capacity} bytes")
        for b in range(pc.batch):
            s0 = base + pc.src_offset + b * pc.src_batch_stride
            d0 = pc.dst_offset + b * pc.dst_batch_stride
            rows = torch.as_strided(flat, (pc.height, pc.width), (pc.src_pitch, 1), s0)
            torch.as_strided(dst, (pc.height, pc.width), (pc.dst_pitch, 1), d0).copy_(rows)

    def phase(self, flags, rank: int, bank: int, marker: torch.Tensor, token: int, stream, bits: int, ready: bool):
        self._run(lambda: self._phase_now(flags.peers, flags.local, rank, bank, marker, token))

    def _phase_now(self, peer_flags, local_flags, rank: int, bank: int, marker: torch.Tensor, token: int) -> None:
        world = len(peer_flags)
        marker[0], marker[1] = token, 0
        for p, flags in enumerate(peer_flags):
            if p != rank:
                flags[bank * world + rank] = 1
        deadline = time.monotonic() + self.timeout_s
        while True:
            behind = [p for p in range(world) if p != rank and int(local_flags[bank * world + p]) != 1]
            if not behind:
                break
            if time.monotonic() > deadline:
                raise UlyssesTimeoutError(
                    f"rank {rank}: peers {behind} did not complete {describe_phase(token)} within {self.timeout_s:g}s "
                    "(a peer died, raised before submitting its part of the group, or is running a different call "
                    "sequence)" + self._notices()
                )
            time.sleep(0.0005)
        for p in range(world):
            if p != rank:
                local_flags[bank * world + p] = 0
        marker[1] = token


def _raw_stream_getter(device: torch.device) -> Callable[[], int]:
    """The current stream's cudaStream_t as an int, without building a torch.cuda.Stream object per call."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(index)
    return lambda: torch.cuda.current_stream(index).cuda_stream


class CudaPrimitives:
    """tf-kernel ops on CUDA streams. Pointers and streams cross into the extension as plain integers."""

    name = "cuda"

    def __init__(self, ops: Any, device: torch.device):
        self.ops = ops  # torch.ops.tf_kernel
        self.device = device
        self._caller_stream = _raw_stream_getter(device)
        # One raw event, re-recorded per call: a stream wait captures the record that precedes it.
        self._ready_event = int(
            ops.event_create(device.index if device.index is not None else torch.cuda.current_device())
        )
        self._device_index = device.index if device.index is not None else torch.cuda.current_device()
        self._copy_stream: torch.cuda.Stream | None = None
        self._copy_stream_handle = 0

    def new_stream(self, high_priority: bool) -> torch.cuda.Stream:
        # Lower numbers are higher priorities; the copy stream gets the highest so its tiny copy and memop
        # commands are not queued behind compute launches.
        least, greatest = torch.cuda.Stream.priority_range()
        stream = torch.cuda.Stream(device=self.device, priority=greatest if high_priority else least)
        self._copy_stream, self._copy_stream_handle = stream, int(stream.cuda_stream)
        return stream

    def copy_list(self, peers: list[int], capacity: int, geometries) -> list[int]:
        """The flat argument list of one call's copies into these peer buffers (cached per target and plan): per
        copy, the destination address and capacity, then the geometry's fields in their declared order."""
        flat: list[int] = []
        for peer, pc in geometries:
            flat += (peers[peer], capacity, *pc.values)
        return flat

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def new_marker(self, dtype: torch.dtype) -> torch.Tensor:
        """Two words of pinned host memory that each phase writes from the copy stream (reached, passed) and the
        watchdog reads without a CUDA call, so it also watches graph replays and never disturbs a capture."""
        return torch.zeros(2, dtype=dtype, pin_memory=True)

    def submit(self, src: torch.Tensor, copies: list[int], stream: torch.cuda.Stream, ready: bool = True) -> None:
        """Every copy in one op; with `ready`, first the readiness wait (the copy stream waits for everything the
        caller's stream has queued)."""
        if ready:
            self.ops.copy_2d_batch(src, copies, self._copy_stream_handle, self._caller_stream(), self._ready_event)
        else:
            self.ops.copy_2d_batch(src, copies, self._copy_stream_handle, 0, 0)

    def phase(self, flags, rank: int, bank: int, marker: torch.Tensor, token: int, stream, bits: int, ready: bool):
        """One handshake phase on the copy stream (tf-kernel `stream_phase`); with `ready`, after the readiness
        wait."""
        self.ops.stream_phase(
            flags.peers,
            flags.local.data_ptr(),
            rank,
            len(flags.peers),
            bank,
            marker.data_ptr(),
            token,
            self._copy_stream_handle,
            bits,
            self._caller_stream() if ready else 0,
            self._ready_event if ready else 0,
            self._device_index,
        )

    def record_completion(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        return stream.record_event()

    def caller_wait(self, event: torch.cuda.Event) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def protect_input(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        tensor.record_stream(stream)  # the allocator must not reuse the input before its copies finish

    def synchronize(self, stream: torch.cuda.Stream) -> None:
        stream.synchronize()

    def close(self) -> None:
        if self._ready_event:
            event, self._ready_event = self._ready_event, 0
            self.ops.event_destroy(event)

    def copy_2d(
        self, src: torch.Tensor, dst_ptr: int, capacity: int, pc: PitchedCopy, stream: torch.cuda.Stream
    ) -> None:
        v = pc.values
        self.ops.copy_2d(src, *v[:3], dst_ptr, capacity, *v[3:], stream.cuda_stream)
