"""The device primitives the copy-engine engine is written against.

`CudaPrimitives` issues tf-kernel's pitched copies and stream-memory handshake on a high-priority CUDA stream, with
CUDA events for readiness and completion. `HostPrimitives` does the same work synchronously on CPU shared memory, so
the engine's state machine runs unchanged in CI. The engine never calls CUDA or tf-kernel directly.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .layout import PitchedCopy


class UlyssesTimeoutError(RuntimeError):
    """A peer did not complete a grouped handshake in time (it died, or raised before submitting)."""


class HostPrimitives:
    """Synchronous stand-ins: copies happen at submission, the handshake spins on shared-memory flags."""

    name = "host"

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s

    def new_stream(self, high_priority: bool) -> None:
        return None

    def record_ready(self, stream) -> None:
        return None

    def record_completion(self, stream) -> None:
        return None

    def caller_wait(self, event) -> None:
        return None

    def protect_input(self, tensor: torch.Tensor, stream) -> None:
        return None

    def synchronize(self, stream) -> None:
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

    def handshake(self, peer_flags: list[torch.Tensor], local_flags: torch.Tensor, rank: int, epoch: int, stream, bits: int) -> None:
        for p, flags in enumerate(peer_flags):
            if p != rank:
                flags[rank] = epoch
        deadline = time.monotonic() + self.timeout_s
        while True:
            behind = [p for p in range(len(peer_flags)) if p != rank and int(local_flags[p]) < epoch]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise UlyssesTimeoutError(
                    f"rank {rank}: peers {behind} did not complete handshake epoch {epoch} within "
                    f"{self.timeout_s:g}s (a peer died or raised before submitting its part of the group)"
                )
            time.sleep(0.0005)


class CudaPrimitives:
    """tf-kernel ops on CUDA streams. Pointers and streams cross into the extension as plain integers."""

    name = "cuda"

    def __init__(self, ops: Any):
        self.ops = ops  # torch.ops.tf_kernel
        self._ready = torch.cuda.Event()  # re-recorded per call: a wait captures the record that precedes it

    def new_stream(self, high_priority: bool) -> torch.cuda.Stream:
        # Lower numbers are higher priorities; the copy stream gets the highest so its tiny copy and memop
        # commands are not queued behind compute launches.
        least, greatest = torch.cuda.Stream.priority_range()
        return torch.cuda.Stream(priority=greatest if high_priority else least)

    def record_ready(self, stream: torch.cuda.Stream) -> None:
        """The copy stream waits until the caller's stream has produced everything submitted so far."""
        self._ready.record(torch.cuda.current_stream())
        stream.wait_event(self._ready)

    def record_completion(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        return stream.record_event()

    def caller_wait(self, event: torch.cuda.Event) -> None:
        torch.cuda.current_stream().wait_event(event)

    def protect_input(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        tensor.record_stream(stream)  # the allocator must not reuse the input before its copies finish

    def synchronize(self, stream: torch.cuda.Stream) -> None:
        stream.synchronize()

    def copy_2d(self, src: torch.Tensor, dst_ptr: int, capacity: int, pc: PitchedCopy, stream: torch.cuda.Stream) -> None:
        self.ops.copy_2d(
            src, pc.src_offset, pc.src_pitch, pc.src_batch_stride, dst_ptr, capacity, pc.dst_offset, pc.dst_pitch,
            pc.dst_batch_stride, pc.width, pc.height, pc.batch, stream.cuda_stream,
        )

    def handshake(self, peer_flags: list[int], local_flags: torch.Tensor, rank: int, epoch: int, stream, bits: int) -> None:
        self.ops.stream_handshake(peer_flags, local_flags.data_ptr(), rank, len(peer_flags), epoch, stream.cuda_stream, bits)
