"""Typed Python wrappers around ``torch.ops.tf_kernel.*``.

Conventions shared by every op:

* Device memory that is not a local tensor (a peer's buffer mapped through CUDA IPC, a flag
  slot) is passed as a raw device address, a Python ``int`` (``tensor.data_ptr()``, or
  what :func:`ipc_open_handle` returned).
* The CUDA stream is passed as an ``int`` cudaStream_t. The wrappers accept a
  ``torch.cuda.Stream`` (or anything with ``.cuda_stream``), an ``int``, or ``None`` for
  ``torch.cuda.current_stream()`` of the relevant device. ``0`` is the legacy default stream.
* All work is enqueued asynchronously on that stream; nothing here synchronises the host.
* Every op validates all arguments before any CUDA call and raises ``RuntimeError`` naming
  the offending value.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "OP_NAMES",
    "StreamLike",
    "build_info",
    "copy_2d",
    "copy_2d_batch",
    "event_create",
    "event_destroy",
    "stream_memop_support",
    "submission_modes",
    "driver_version",
    "get_address_range",
    "ipc_close_handle",
    "ipc_get_handle",
    "ipc_handle_offset",
    "ipc_open_handle",
    "runtime_version",
    "stream_handshake",
    "stream_is_capturing",
    "stream_phase",
    "stream_wait_value",
    "stream_write_value",
]

#: Every operator this library registers under ``torch.ops.tf_kernel``.
OP_NAMES: Tuple[str, ...] = (
    "copy_2d",
    "copy_2d_batch",
    "event_create",
    "event_destroy",
    "stream_memop_support",
    "submission_modes",
    "stream_write_value",
    "stream_wait_value",
    "stream_handshake",
    "stream_phase",
    "stream_is_capturing",
    "ipc_get_handle",
    "ipc_open_handle",
    "ipc_close_handle",
    "get_address_range",
    "build_info",
    "driver_version",
    "runtime_version",
)

#: Size of the tensor returned by :func:`ipc_get_handle`: 64-byte cudaIpcMemHandle_t + uint64 offset.
IPC_HANDLE_BYTES = 72

StreamLike = Union[None, int, "torch.cuda.Stream", Any]  # None | int | torch.cuda.Stream | ExternalStream


def _stream_handle(stream: StreamLike, device: Optional[torch.device] = None) -> int:
    if stream is None:
        return int(torch.cuda.current_stream(device).cuda_stream)
    if isinstance(stream, bool):
        raise TypeError("stream must be None, an int cudaStream_t or a torch.cuda.Stream, not bool")
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise TypeError(f"stream must be None, an int cudaStream_t or a torch.cuda.Stream, got {type(stream)!r}")
    return int(handle)


def _storage_bytes_from(t: torch.Tensor) -> int:
    """Bytes of t's storage at or after t.data_ptr()."""
    return t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()


def copy_2d(
    src: torch.Tensor,
    dst: Union[int, torch.Tensor],
    *,
    width_bytes: int,
    height: int,
    src_pitch_bytes: int,
    dst_pitch_bytes: int,
    batch: int = 1,
    src_offset_bytes: int = 0,
    src_batch_stride_bytes: int = 0,
    dst_offset_bytes: int = 0,
    dst_batch_stride_bytes: int = 0,
    dst_capacity_bytes: Optional[int] = None,
    stream: StreamLike = None,
) -> None:
    """Pitched copy-engine copy, one ``cudaMemcpy2DAsync(..., cudaMemcpyDefault)`` per batch item.

    For ``b in range(batch)`` copies ``height`` rows of ``width_bytes`` bytes from
    ``src.data_ptr() + src_offset_bytes + b*src_batch_stride_bytes`` (rows ``src_pitch_bytes``
    apart) to ``dst + dst_offset_bytes + b*dst_batch_stride_bytes`` (rows ``dst_pitch_bytes``
    apart). ``src.data_ptr()`` already includes the tensor's storage offset, so ``src`` may be
    a strided view (e.g. the V view ``qkv[:, :, 2]`` of a fused ``[B, S, 3, H, D]`` tensor).

    Args:
        src: CUDA tensor (any dtype; only its bytes are used). Reads are bounds-checked
            against the bytes of its storage at or after ``src.data_ptr()``.
        dst: destination device address (``int``, e.g. a peer buffer opened with
            :func:`ipc_open_handle`) or a tensor (its ``data_ptr()``; then
            ``dst_capacity_bytes`` defaults to its storage bytes from ``data_ptr()`` on).
        dst_capacity_bytes: bytes writable from ``dst`` on; required when ``dst`` is an int.
        stream: stream to enqueue on; default ``torch.cuda.current_stream(src.device)``.

    ``width_bytes``, ``height`` or ``batch`` equal to 0 is a validated no-op. Raises
    RuntimeError on negative sizes, ``width_bytes`` larger than a pitch, or a read/write that
    would leave the source storage / destination capacity.
    """
    if isinstance(dst, torch.Tensor):
        dst_ptr = int(dst.data_ptr())
        if dst_capacity_bytes is None:
            dst_capacity_bytes = _storage_bytes_from(dst)
    else:
        dst_ptr = int(dst)
        if dst_capacity_bytes is None:
            raise TypeError("copy_2d: dst_capacity_bytes is required when dst is a raw address")
    s = _stream_handle(stream, src.device if src.is_cuda else None)
    torch.ops.tf_kernel.copy_2d(
        src,
        int(src_offset_bytes),
        int(src_pitch_bytes),
        int(src_batch_stride_bytes),
        dst_ptr,
        int(dst_capacity_bytes),
        int(dst_offset_bytes),
        int(dst_pitch_bytes),
        int(dst_batch_stride_bytes),
        int(width_bytes),
        int(height),
        int(batch),
        s,
    )


#: Ints per copy in :func:`copy_2d_batch`'s ``copies`` list.
COPY_FIELDS = 11


def copy_2d_batch(
    src: torch.Tensor,
    copies: Sequence[int],
    *,
    stream: StreamLike = None,
    wait_stream: StreamLike = None,
    wait_event: int = 0,
) -> None:
    """Several pitched copies from one source in one op, and one driver call where the runtime allows.

    ``copies`` holds :data:`COPY_FIELDS` ints per copy: ``dst_ptr, dst_capacity_bytes, src_offset_bytes,
    src_pitch_bytes, src_batch_stride_bytes, dst_offset_bytes, dst_pitch_bytes, dst_batch_stride_bytes,
    width_bytes, height, batch`` -- the arguments of :func:`copy_2d`, validated the same way, each copy named by
    its index in errors. With ``wait_event`` (a handle from :func:`event_create`), the op first records it on
    ``wait_stream`` (default: the current stream) and makes ``stream`` wait on it: the copies then read only what
    ``wait_stream`` has produced. The copies go out as one ``cudaMemcpy3DBatchAsync`` (CUDA 12.8+; a copy whose
    batch strides are whole numbers of pitches is one 3-D operation) or, where the runtime refuses that, one
    ``cudaMemcpy2DAsync`` per copy and batch item (:func:`submission_modes` says which ran).
    """
    s = _stream_handle(stream, src.device if src.is_cuda else None)
    ws = _stream_handle(wait_stream, src.device if src.is_cuda else None) if wait_event else 0
    torch.ops.tf_kernel.copy_2d_batch(src, [int(c) for c in copies], s, ws, int(wait_event))


def _device_index(device: Union[None, int, torch.device]) -> int:
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, torch.device):
        return int(device.index) if device.index is not None else int(torch.cuda.current_device())
    return int(device)


def event_create(device: Union[None, int, torch.device] = None) -> int:
    """A ``cudaEvent_t`` (timing disabled) on ``device`` (default: the current one), as an int; destroy it with
    :func:`event_destroy`."""
    return int(torch.ops.tf_kernel.event_create(_device_index(device)))


def event_destroy(event: int) -> None:
    torch.ops.tf_kernel.event_destroy(int(event))


def stream_memop_support(device: Union[None, int, torch.device] = None) -> Tuple[bool, bool]:
    """(32-bit, 64-bit) stream memory operations usable on ``device``: the driver's _v2 memop entry points resolve,
    and for 64 bits ``CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`` is set."""
    memops32, memops64 = torch.ops.tf_kernel.stream_memop_support(_device_index(device))
    return bool(memops32), bool(memops64)


def submission_modes() -> Tuple[int, int]:
    """(copy_2d_batch, stream_handshake) modes of this process: 1 -- the last call was one batched driver call
    (``cudaMemcpy3DBatchAsync`` / ``cuStreamBatchMemOp``); 0 -- the runtime refused it, one call per operation;
    -1 -- not run yet."""
    copies, memops = torch.ops.tf_kernel.submission_modes()
    return int(copies), int(memops)


def stream_write_value(address: int, value: int, *, bits: int = 64, stream: StreamLike = None) -> None:
    """Enqueue ``cuStreamWrite{32,64}(stream, address, value, CU_STREAM_WRITE_VALUE_DEFAULT)``.

    The write is preceded by a memory fence scoped to the stream, so work issued earlier on
    the stream (e.g. copies into a peer's buffer) is visible before the value is.
    ``address`` must be ``bits/8``-aligned device memory (local, or a peer's mapped through
    CUDA IPC). With ``bits=32``, ``value`` must be in ``[0, 2**32)``; with ``bits=64`` any
    int64 (stored as its two's-complement uint64).
    """
    torch.ops.tf_kernel.stream_write_value(int(address), int(value), _stream_handle(stream), int(bits))


def stream_wait_value(address: int, value: int, *, bits: int = 64, stream: StreamLike = None) -> None:
    """Make ``stream`` wait until ``(intN_t)(*address - value) >= 0`` (``CU_STREAM_WAIT_VALUE_GEQ``).

    The comparison is cyclic, so 32-bit epochs keep working across wraparound (peers less than
    2**31 apart), and a value already overtaken by a later epoch still satisfies the wait.
    The host does not block. Never make a stream wait on a value that another stream of the
    same process must write with a stream memory operation: on the H200 that can deadlock.
    """
    torch.ops.tf_kernel.stream_wait_value(int(address), int(value), _stream_handle(stream), int(bits))


def stream_handshake(
    peer_flag_ptrs: Sequence[int],
    local_flag_ptr: int,
    *,
    rank: int,
    epoch: int,
    world_size: Optional[int] = None,
    bits: int = 64,
    stream: StreamLike = None,
) -> None:
    """Stream-ordered all-to-all barrier through flag arrays (no SM kernel).

    Every rank owns a flag array of ``world_size`` elements of ``bits`` bits (zeroed once at
    allocation) and has mapped every peer's array. This enqueues on ``stream``:

    1. for every peer ``p != rank``: write ``epoch`` into slot ``rank`` of peer ``p``'s array,
       i.e. at ``peer_flag_ptrs[p] + rank * bits//8`` (preceded by a memory fence, so
       everything issued earlier on the stream, such as copies into ``p``'s buffers, is
       visible to ``p`` first);
    2. for every peer ``p != rank``: wait until slot ``p`` of the local array,
       ``local_flag_ptr + p * bits//8``, is ``>= epoch`` (cyclic GEQ).

    ``peer_flag_ptrs[rank]`` is ignored (may be 0). ``epoch`` must be > 0 and should grow by
    one per handshake; with ``bits=32`` its low 32 bits are used. ``world_size`` defaults to
    ``len(peer_flag_ptrs)``; ``world_size == 1`` is a validated no-op.
    """
    ptrs = [int(p) for p in peer_flag_ptrs]
    ws = len(ptrs) if world_size is None else int(world_size)
    torch.ops.tf_kernel.stream_handshake(
        ptrs, int(local_flag_ptr), int(rank), ws, int(epoch), _stream_handle(stream), int(bits)
    )


def stream_phase(
    peer_flag_ptrs: Sequence[int],
    local_flag_ptr: int,
    *,
    rank: int,
    bank: int,
    marker_ptr: int = 0,
    token: int = 0,
    bits: int = 32,
    stream: StreamLike = None,
    wait_stream: StreamLike = None,
    wait_event: int = 0,
    device: Union[None, int, torch.device] = None,
) -> None:
    """One phase of a grouped handshake whose flag values are constant, so that a captured CUDA graph replays it
    exactly (no epoch to go stale).

    Every rank owns a flag array of ``2 * world_size`` elements (bank-major: bank ``b``'s slot ``p`` at index
    ``b * world_size + p``), zeroed once, and has mapped every peer's. With ``wait_event`` the op first records it
    on ``wait_stream`` (default: the current stream) and makes ``stream`` wait on it. Then it enqueues on
    ``stream``, as one ``cuStreamBatchMemOp`` where the driver takes it: with ``marker_ptr`` (two words of host-
    or device-visible memory for a watchdog), ``marker[0] = token`` and ``marker[1] = 0``; a write of 1 into slot
    ``rank`` of bank ``bank`` of every peer's array (after a fence: earlier copies on ``stream`` land first); a
    wait until slot ``p`` of bank ``bank`` of the local array is 1 for every peer ``p``; a write of 0 into those
    slots; with ``marker_ptr``, ``marker[1] = token``. A rank's consecutive phases must alternate banks: a peer
    publishes into a bank again only after it passed a phase of the other bank, which this rank entered only
    after resetting the first one.
    """
    ptrs = [int(p) for p in peer_flag_ptrs]
    s = _stream_handle(stream)
    ws = _stream_handle(wait_stream) if wait_event else 0
    torch.ops.tf_kernel.stream_phase(
        ptrs, int(local_flag_ptr), int(rank), len(ptrs), int(bank), int(marker_ptr), int(token), s, int(bits), ws,
        int(wait_event), _device_index(device),
    )  # fmt: skip


def stream_is_capturing(stream: StreamLike = None) -> bool:
    """Whether ``stream`` (default: the current one) is being captured into a CUDA graph."""
    return bool(torch.ops.tf_kernel.stream_is_capturing(_stream_handle(stream)))


def ipc_get_handle(t: torch.Tensor) -> torch.Tensor:
    """CUDA IPC handle for the allocation holding ``t``, plus ``t``'s offset in it.

    Returns a CPU ``uint8`` tensor of 72 bytes: the 64-byte ``cudaIpcMemHandle_t`` of the
    allocation base (found with ``cuMemGetAddressRange``), then the little-endian uint64
    byte offset of ``t.data_ptr()`` within that allocation. Send it to another process and
    open it there with :func:`ipc_open_handle`. Fails for memory not allocated with
    cudaMalloc (e.g. torch's ``expandable_segments:True`` allocator).
    """
    return torch.ops.tf_kernel.ipc_get_handle(t)


def ipc_handle_offset(handle: torch.Tensor) -> int:
    """The byte offset stored in the last 8 bytes of an :func:`ipc_get_handle` tensor."""
    if handle.numel() != IPC_HANDLE_BYTES:
        raise ValueError(f"an IPC handle has {IPC_HANDLE_BYTES} bytes, got {handle.numel()}")
    return int.from_bytes(bytes(handle.reshape(-1)[64:].tolist()), "little")


def ipc_open_handle(handle: torch.Tensor, device: Union[None, int, torch.device] = None, nbytes: int = 0) -> int:
    """Map a peer allocation: ``cudaIpcOpenMemHandle(..., cudaIpcMemLazyEnablePeerAccess)``.

    ``handle`` is the 72-byte CPU uint8 tensor from :func:`ipc_get_handle` (made in another
    process; CUDA refuses to open a handle in the process that exported it). The mapping is
    made on ``device`` (default: the current device) and the returned int is the mapped
    allocation base plus the stored offset, i.e. the peer's ``t.data_ptr()`` in this process.
    With ``nbytes``, the mapping must also hold ``[offset, offset + nbytes)`` (else it is closed again
    and the call raises). Close it once with :func:`ipc_close_handle`.
    """
    if device is None:
        return int(torch.ops.tf_kernel.ipc_open_handle(handle, int(nbytes)))
    with torch.cuda.device(device):
        return int(torch.ops.tf_kernel.ipc_open_handle(handle, int(nbytes)))


def ipc_close_handle(ptr: int) -> None:
    """Unmap a pointer returned by :func:`ipc_open_handle` (any address inside the mapping).

    Resolves the mapping base with ``cuMemGetAddressRange`` and calls ``cudaIpcCloseMemHandle``.
    """
    torch.ops.tf_kernel.ipc_close_handle(int(ptr))


def get_address_range(ptr: int) -> Tuple[int, int]:
    """``(base, size)`` of the CUDA allocation containing device address ``ptr`` (cuMemGetAddressRange)."""
    base, size = torch.ops.tf_kernel.get_address_range(int(ptr))
    return int(base), int(size)


def build_info() -> str:
    """What the compiled library says about itself (``key=value;...``)."""
    return str(torch.ops.tf_kernel.build_info())


def driver_version() -> int:
    """``cudaDriverGetVersion`` (e.g. 13000); 0 when no NVIDIA driver is installed."""
    return int(torch.ops.tf_kernel.driver_version())


def runtime_version() -> int:
    """``cudaRuntimeGetVersion`` of the CUDA runtime the library is using."""
    return int(torch.ops.tf_kernel.runtime_version())
