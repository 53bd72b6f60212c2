"""CPU-only tests: import, registration, schemas, argument validation, build compatibility.

Nothing here needs (or touches) a GPU: every op validates all of its arguments before any
CUDA call, and copy_2d checks its geometry before the device of `src`, so these checks run
with CPU tensors and fake device addresses. Run after `make build-sm90`.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import tf_kernel
from tf_kernel import check_build_compatibility

FAKE_PTR = 1 << 40  # a plausible, 8-byte aligned device address; never dereferenced here

EXPECTED_SCHEMAS = {
    "copy_2d": "tf_kernel::copy_2d(Tensor src, int src_offset_bytes, int src_pitch_bytes, "
    "int src_batch_stride_bytes, int dst_ptr, int dst_capacity_bytes, int dst_offset_bytes, "
    "int dst_pitch_bytes, int dst_batch_stride_bytes, int width_bytes, int height, int batch, "
    "int stream) -> ()",
    "stream_write_value": "tf_kernel::stream_write_value(int address, int value, int stream, int bits) -> ()",
    "stream_wait_value": "tf_kernel::stream_wait_value(int address, int value, int stream, int bits) -> ()",
    "stream_handshake": "tf_kernel::stream_handshake(int[] peer_flag_ptrs, int local_flag_ptr, int rank, "
    "int world_size, int epoch, int stream, int bits) -> ()",
    "stream_phase": "tf_kernel::stream_phase(int[] peer_flag_ptrs, int local_flag_ptr, int rank, int world_size, "
    "int bank, int marker_ptr, int token, int stream, int bits, int wait_stream=0, int wait_event=0, "
    "int device=0) -> ()",
    "stream_is_capturing": "tf_kernel::stream_is_capturing(int stream) -> bool",
    "ipc_get_handle": "tf_kernel::ipc_get_handle(Tensor t) -> Tensor",
    "ipc_open_handle": "tf_kernel::ipc_open_handle(Tensor handle, int nbytes=0) -> int",
    "copy_2d_batch": "tf_kernel::copy_2d_batch(Tensor src, int[] copies, int stream, int wait_stream=0, "
    "int wait_event=0) -> ()",
    "event_create": "tf_kernel::event_create(int device) -> int",
    "event_destroy": "tf_kernel::event_destroy(int event) -> ()",
    "stream_memop_support": "tf_kernel::stream_memop_support(int device) -> (int, int)",
    "submission_modes": "tf_kernel::submission_modes() -> (int, int)",
    "ipc_close_handle": "tf_kernel::ipc_close_handle(int ptr) -> ()",
    "get_address_range": "tf_kernel::get_address_range(int ptr) -> (int, int)",
    "build_info": "tf_kernel::build_info() -> str",
    "driver_version": "tf_kernel::driver_version() -> int",
    "runtime_version": "tf_kernel::runtime_version() -> int",
}

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a usable CUDA device")


# --------------------------------------------------------------------------------------
# import, build info, registration
# --------------------------------------------------------------------------------------
def test_import_uses_installed_build():
    src_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pkg_dir = os.path.dirname(os.path.abspath(tf_kernel.__file__))
    assert not pkg_dir.startswith(os.path.join(src_root, "tf_kernel")), pkg_dir
    assert os.path.isfile(tf_kernel.LIBRARY_PATH)
    assert tf_kernel.LIBRARY_PATH in torch.ops.loaded_libraries
    assert tf_kernel.__version__ == "0.1.0"


def test_build_info_matches_running_torch():
    info = tf_kernel.BUILD_INFO
    for key in (
        "tf_kernel_version",
        "torch_version",
        "torch_cuda_version",
        "nvcc_version",
        "cuda_archs",
        "python_version",
        "build_date",
    ):
        assert key in info, key
    assert info["torch_version"] == torch.__version__
    assert info["torch_cuda_version"] == torch.version.cuda
    assert info["tf_kernel_version"] == "0.1.0"
    assert info["nvcc_version"].split(".")[0].isdigit()
    assert "sm_90a" in info["cuda_archs"]


def test_build_info_op():
    text = tf_kernel.build_info()
    fields = dict(kv.split("=", 1) for kv in text.split(";"))
    assert fields["tf_kernel"] == "0.1.0"
    assert fields["torch"] == torch.__version__
    assert "sm_90a" in fields["cuda_archs"].split(",")
    assert fields["cudart"] == "shared"
    assert int(fields["cudart_headers"]) >= 12000


@pytest.mark.parametrize("name", sorted(EXPECTED_SCHEMAS))
def test_op_registered_with_schema(name):
    op = getattr(torch.ops.tf_kernel, name)
    assert str(op.default._schema) == EXPECTED_SCHEMAS[name]


def test_op_names_complete():
    assert set(tf_kernel.OP_NAMES) == set(EXPECTED_SCHEMAS)


def test_capabilities():
    caps = tf_kernel.capabilities()
    assert caps["all_ops_registered"] is True
    assert all(caps["ops"][name] for name in EXPECTED_SCHEMAS)
    assert caps["cuda_available"] == torch.cuda.is_available()
    assert caps["usable"] == torch.cuda.is_available()
    assert caps["build"]["torch_version"] == torch.__version__
    assert isinstance(caps["cuda_driver_version"], int) and caps["cuda_driver_version"] >= 0


@no_cuda
def test_driver_version_without_driver_is_zero_or_clear():
    # cudaDriverGetVersion reports 0 when no driver is installed (this CI machine).
    assert tf_kernel.driver_version() >= 0


def test_schema_rejects_wrong_argument_types():
    with pytest.raises((RuntimeError, TypeError)):
        torch.ops.tf_kernel.stream_write_value(FAKE_PTR, 1.5, 0, 64)
    with pytest.raises((RuntimeError, TypeError)):
        torch.ops.tf_kernel.copy_2d(torch.zeros(4), 0, 0)


# --------------------------------------------------------------------------------------
# copy_2d validation (CPU tensors: geometry is checked before the device)
# --------------------------------------------------------------------------------------
def _copy_args(src, **kw):
    args = dict(
        src_offset_bytes=0,
        src_pitch_bytes=64,
        src_batch_stride_bytes=0,
        dst_ptr=FAKE_PTR,
        dst_capacity_bytes=4096,
        dst_offset_bytes=0,
        dst_pitch_bytes=64,
        dst_batch_stride_bytes=0,
        width_bytes=64,
        height=4,
        batch=1,
        stream=0,
    )
    args.update(kw)
    return (
        src,
        args["src_offset_bytes"],
        args["src_pitch_bytes"],
        args["src_batch_stride_bytes"],
        args["dst_ptr"],
        args["dst_capacity_bytes"],
        args["dst_offset_bytes"],
        args["dst_pitch_bytes"],
        args["dst_batch_stride_bytes"],
        args["width_bytes"],
        args["height"],
        args["batch"],
        args["stream"],
    )


def _copy(src, **kw):
    torch.ops.tf_kernel.copy_2d(*_copy_args(src, **kw))


def test_copy_2d_cpu_tensor_rejected():
    src = torch.zeros(256, dtype=torch.uint8)  # exactly 4 rows of 64 bytes
    with pytest.raises(RuntimeError, match=r"tf_kernel.copy_2d: src must be a CUDA tensor, got a tensor on cpu"):
        _copy(src)


def test_copy_2d_zero_sizes_still_validated():
    src = torch.zeros(256, dtype=torch.uint8)
    for kw in (dict(width_bytes=0), dict(height=0), dict(batch=0)):
        with pytest.raises(RuntimeError, match="src must be a CUDA tensor"):
            _copy(src, **kw)


@pytest.mark.parametrize(
    "name",
    [
        "src_offset_bytes",
        "src_pitch_bytes",
        "src_batch_stride_bytes",
        "dst_capacity_bytes",
        "dst_offset_bytes",
        "dst_pitch_bytes",
        "dst_batch_stride_bytes",
        "width_bytes",
        "height",
        "batch",
    ],
)
def test_copy_2d_negative_sizes(name):
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=rf"tf_kernel.copy_2d: {name} must be >= 0, got -3"):
        _copy(src, **{name: -3})


def test_copy_2d_negative_stream():
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"stream must be a cudaStream_t passed as a non-negative int.*got -1"):
        _copy(src, stream=-1)


def test_copy_2d_null_dst():
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"dst_ptr must be a non-null device address.*got 0"):
        _copy(src, dst_ptr=0)


def test_copy_2d_width_exceeds_pitch():
    src = torch.zeros(1024, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"width_bytes \(65\) exceeds src_pitch_bytes \(64\)"):
        _copy(src, width_bytes=65, dst_pitch_bytes=128)
    with pytest.raises(RuntimeError, match=r"width_bytes \(65\) exceeds dst_pitch_bytes \(64\)"):
        _copy(src, width_bytes=65, src_pitch_bytes=128)


def test_copy_2d_src_out_of_bounds_rows():
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(
        RuntimeError, match=r"source read out of bounds: the last byte read ends 320 bytes .* only has 256 bytes"
    ):
        _copy(src, height=5)


def test_copy_2d_src_out_of_bounds_offset():
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"source read out of bounds: the last byte read ends 257 bytes"):
        _copy(src, src_offset_bytes=1)


def test_copy_2d_src_out_of_bounds_batch():
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"source read out of bounds"):
        _copy(src, batch=2, src_batch_stride_bytes=256, dst_batch_stride_bytes=256)
    with pytest.raises(RuntimeError, match=r"src must be a CUDA tensor"):  # batch 2 fits in 512 bytes
        _copy(torch.zeros(512, dtype=torch.uint8), batch=2, src_batch_stride_bytes=256, dst_batch_stride_bytes=256)


def test_copy_2d_src_bounds_account_for_storage_offset():
    base = torch.zeros(256, dtype=torch.uint8)
    view = base[10:]  # 246 bytes left from view.data_ptr()
    with pytest.raises(RuntimeError, match=r"only has 246 bytes from src.data_ptr\(\) on"):
        _copy(view)
    with pytest.raises(RuntimeError, match=r"src must be a CUDA tensor"):
        _copy(view, height=3, width_bytes=54)  # 2*64 + 54 + ... = 182 <= 246
    wide = torch.zeros(64, dtype=torch.float32)[4:]  # itemsize 4: 240 bytes left
    with pytest.raises(RuntimeError, match=r"only has 240 bytes"):
        _copy(wide)


def test_copy_2d_strided_v_view_geometry():
    # The Ulysses case: V of a fused [B, S, 3, H, D] QKV, scattered by head groups.
    B, S, H, D, W = 2, 5, 8, 16, 4
    qkv = torch.zeros(B, S, 3, H, D, dtype=torch.bfloat16)
    v = qkv[:, :, 2]
    e = v.element_size()
    hw = H // W
    width = hw * D * e
    kw = dict(
        src_pitch_bytes=v.stride(1) * e,
        src_batch_stride_bytes=v.stride(0) * e,
        dst_capacity_bytes=B * S * W * hw * D * e,
        dst_pitch_bytes=width,
        dst_batch_stride_bytes=S * W * width,
        width_bytes=width,
        height=S,
        batch=B,
    )
    # The last head group of the last row of the last batch ends exactly at the end of
    # the storage: in bounds, so the only complaint is the device.
    with pytest.raises(RuntimeError, match=r"src must be a CUDA tensor"):
        _copy(v, src_offset_bytes=(W - 1) * width, dst_offset_bytes=(W - 1) * S * width, **kw)
    # One more element is out of bounds.
    with pytest.raises(RuntimeError, match=r"source read out of bounds"):
        _copy(v, src_offset_bytes=(W - 1) * width + e, dst_offset_bytes=0, **kw)
    # Destination: writing rank W's rows would overflow the [B, S*W, H/W, D] output.
    with pytest.raises(RuntimeError, match=r"destination write out of bounds"):
        _copy(v, src_offset_bytes=0, dst_offset_bytes=W * S * width, **kw)


def test_copy_2d_dst_out_of_bounds():
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(
        RuntimeError,
        match=r"destination write out of bounds: the last byte written ends 256 bytes .* dst_capacity_bytes is 255",
    ):
        _copy(src, dst_capacity_bytes=255)
    with pytest.raises(RuntimeError, match=r"destination write out of bounds: the last byte written ends 4352"):
        _copy(src, dst_offset_bytes=4096)


def test_copy_2d_overflow():
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"overflows int64"):
        _copy(src, batch=3, src_batch_stride_bytes=(1 << 62))
    with pytest.raises(RuntimeError, match=r"overflows the address space"):
        _copy(src, dst_ptr=(1 << 62), dst_capacity_bytes=(1 << 62) + (1 << 61))


def test_copy_2d_wrapper_requires_capacity_for_raw_pointer():
    with pytest.raises(TypeError, match="dst_capacity_bytes is required"):
        tf_kernel.copy_2d(
            torch.zeros(8),
            FAKE_PTR,
            width_bytes=8,
            height=1,
            src_pitch_bytes=8,
            dst_pitch_bytes=8,
            stream=0,
        )


def test_copy_2d_wrapper_passes_through_validation():
    with pytest.raises(RuntimeError, match=r"src must be a CUDA tensor"):
        tf_kernel.copy_2d(
            torch.zeros(64, dtype=torch.uint8),
            torch.zeros(64, dtype=torch.uint8),  # dst tensor: capacity from its storage
            width_bytes=16,
            height=4,
            src_pitch_bytes=16,
            dst_pitch_bytes=16,
            stream=0,
        )
    with pytest.raises(RuntimeError, match=r"dst_capacity_bytes is 63"):
        tf_kernel.copy_2d(
            torch.zeros(64, dtype=torch.uint8),
            torch.zeros(64, dtype=torch.uint8)[1:],
            width_bytes=16,
            height=4,
            src_pitch_bytes=16,
            dst_pitch_bytes=16,
            stream=0,
        )


# --------------------------------------------------------------------------------------
# copy_2d_batch: every copy validated like copy_2d, each named by its index
# --------------------------------------------------------------------------------------
def _batch_entry(**kw):
    a = _copy_args(
        None, **kw
    )  # (src, src_off, src_pitch, src_bstride, dst, cap, dst_off, dst_pitch, dst_bstride, w, h, b, s)
    return [a[4], a[5], a[1], a[2], a[3], a[6], a[7], a[8], a[9], a[10], a[11]]


def test_copy_2d_batch_validates_each_copy_before_the_device():
    src = torch.zeros(256, dtype=torch.uint8)
    good = _batch_entry()
    with pytest.raises(RuntimeError, match=r"tf_kernel.copy_2d_batch: src must be a CUDA tensor, got a tensor on cpu"):
        torch.ops.tf_kernel.copy_2d_batch(src, good + good, 0)
    with pytest.raises(RuntimeError, match=r"copy 1: height must be >= 0, got -1"):
        torch.ops.tf_kernel.copy_2d_batch(src, good + _batch_entry(height=-1), 0)
    with pytest.raises(RuntimeError, match=r"copy 0: source read out of bounds"):
        torch.ops.tf_kernel.copy_2d_batch(src, _batch_entry(height=5) + good, 0)
    with pytest.raises(RuntimeError, match=r"copy 1: destination write out of bounds"):
        torch.ops.tf_kernel.copy_2d_batch(src, good + _batch_entry(dst_capacity_bytes=100), 0)
    with pytest.raises(RuntimeError, match=r"copy 0: width_bytes \(65\) exceeds src_pitch_bytes \(64\)"):
        torch.ops.tf_kernel.copy_2d_batch(src, _batch_entry(width_bytes=65), 0)


def test_copy_2d_batch_argument_shape_and_streams():
    src = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"copies must hold 11 ints per copy .* got 10 ints"):
        torch.ops.tf_kernel.copy_2d_batch(src, _batch_entry()[:10], 0)
    with pytest.raises(RuntimeError, match=r"stream must be a cudaStream_t passed as a non-negative int.*got -2"):
        torch.ops.tf_kernel.copy_2d_batch(src, _batch_entry(), -2)
    with pytest.raises(RuntimeError, match=r"wait_event must be 0 \(none\) or a cudaEvent_t"):
        torch.ops.tf_kernel.copy_2d_batch(src, _batch_entry(), 0, 0, -5)
    with pytest.raises(RuntimeError, match=r"stream must be a cudaStream_t.*got -1"):
        torch.ops.tf_kernel.copy_2d_batch(src, _batch_entry(), 0, -1, FAKE_PTR)


def test_submission_helpers_validate_and_report():
    assert all(m in (-1, 0, 1) for m in torch.ops.tf_kernel.submission_modes())
    with pytest.raises(RuntimeError, match=r"event_create: device must be a CUDA device index, got -1"):
        torch.ops.tf_kernel.event_create(-1)
    with pytest.raises(RuntimeError, match=r"event_destroy: event must be a cudaEvent_t returned by event_create"):
        torch.ops.tf_kernel.event_destroy(0)
    with pytest.raises(RuntimeError, match=r"stream_memop_support: device must be a CUDA device index, got -3"):
        torch.ops.tf_kernel.stream_memop_support(-3)


@no_cuda
def test_memop_support_without_driver_fails_clearly():
    with pytest.raises(RuntimeError, match=r"tf_kernel: cuda"):
        torch.ops.tf_kernel.stream_memop_support(0)


# --------------------------------------------------------------------------------------
# stream memory operations
# --------------------------------------------------------------------------------------
MEMOPS = ["stream_write_value", "stream_wait_value"]


@pytest.mark.parametrize("op", MEMOPS)
@pytest.mark.parametrize("bits", [0, 8, 16, 63, 128])
def test_memop_bad_bits(op, bits):
    with pytest.raises(RuntimeError, match=rf"tf_kernel.{op}: bits must be 32 or 64, got {bits}"):
        getattr(torch.ops.tf_kernel, op)(FAKE_PTR, 1, 0, bits)


@pytest.mark.parametrize("op", MEMOPS)
def test_memop_null_and_negative_address(op):
    with pytest.raises(RuntimeError, match=r"address is a null device address"):
        getattr(torch.ops.tf_kernel, op)(0, 1, 0, 64)
    with pytest.raises(RuntimeError, match=r"address must be a device address passed as a positive int, got -8"):
        getattr(torch.ops.tf_kernel, op)(-8, 1, 0, 64)


@pytest.mark.parametrize("op", MEMOPS)
def test_memop_misaligned(op):
    with pytest.raises(RuntimeError, match=r"must be 8-byte aligned for 64-bit"):
        getattr(torch.ops.tf_kernel, op)(FAKE_PTR + 4, 1, 0, 64)
    with pytest.raises(RuntimeError, match=r"must be 4-byte aligned for 32-bit"):
        getattr(torch.ops.tf_kernel, op)(FAKE_PTR + 2, 1, 0, 32)


@pytest.mark.parametrize("op", MEMOPS)
@pytest.mark.parametrize("value", [-1, 1 << 32])
def test_memop_32bit_value_range(op, value):
    with pytest.raises(RuntimeError, match=r"value must fit in an unsigned 32-bit word"):
        getattr(torch.ops.tf_kernel, op)(FAKE_PTR, value, 0, 32)


@pytest.mark.parametrize("op", MEMOPS)
def test_memop_negative_stream(op):
    with pytest.raises(RuntimeError, match=r"stream must be a cudaStream_t"):
        getattr(torch.ops.tf_kernel, op)(FAKE_PTR, 1, -5, 64)


@no_cuda
def test_memop_without_driver_fails_clearly():
    # Valid arguments reach the driver lookup, which must fail with an explanation rather
    # than crash (no libcuda.so on this machine).
    with pytest.raises(RuntimeError, match=r"tf_kernel: .*(driver|cuCtxGetCurrent|cudaGetDevice|cudaSetDevice)"):
        tf_kernel.stream_write_value(FAKE_PTR, 1, bits=64, stream=0)


def _handshake(peers, local=FAKE_PTR, rank=0, world_size=None, epoch=1, stream=0, bits=64):
    ws = len(peers) if world_size is None else world_size
    torch.ops.tf_kernel.stream_handshake(list(peers), local, rank, ws, epoch, stream, bits)


def test_handshake_bad_bits():
    with pytest.raises(RuntimeError, match=r"tf_kernel.stream_handshake: bits must be 32 or 64, got 16"):
        _handshake([FAKE_PTR, FAKE_PTR], bits=16)


def test_handshake_epoch_must_be_positive():
    for epoch in (0, -1):
        with pytest.raises(RuntimeError, match=rf"epoch must be > 0 .*got {epoch}"):
            _handshake([FAKE_PTR, FAKE_PTR], epoch=epoch)


def test_handshake_peer_list_length():
    with pytest.raises(RuntimeError, match=r"len\(peer_flag_ptrs\) \(3\) must equal world_size \(2\)"):
        _handshake([FAKE_PTR] * 3, world_size=2)
    with pytest.raises(RuntimeError, match=r"world_size must be >= 1, got 0"):
        _handshake([], world_size=0)


def test_handshake_rank_range():
    for rank in (-1, 2):
        with pytest.raises(RuntimeError, match=rf"rank must satisfy 0 <= rank < world_size \(2\), got {rank}"):
            _handshake([FAKE_PTR, FAKE_PTR], rank=rank)


def test_handshake_null_and_misaligned_pointers():
    with pytest.raises(RuntimeError, match=r"peer_flag_ptrs\[1\] is a null device address"):
        _handshake([FAKE_PTR, 0], rank=0)
    with pytest.raises(RuntimeError, match=r"local_flag_ptr is a null device address"):
        _handshake([FAKE_PTR, FAKE_PTR], local=0)
    with pytest.raises(RuntimeError, match=r"local_flag_ptr \(\d+\) must be 8-byte aligned"):
        _handshake([FAKE_PTR, FAKE_PTR], local=FAKE_PTR + 4)
    with pytest.raises(RuntimeError, match=r"peer_flag_ptrs\[0\] \(\d+\) must be 4-byte aligned"):
        _handshake([FAKE_PTR + 1, FAKE_PTR], rank=1, bits=32)
    with pytest.raises(RuntimeError, match=r"stream must be a cudaStream_t"):
        _handshake([FAKE_PTR, FAKE_PTR], stream=-2)


def test_handshake_world_size_one_is_a_no_op():
    # Nothing to synchronise with: validated, then returns without any CUDA call (so it
    # works on this CPU machine). The rank's own entry is ignored and may be 0.
    _handshake([0], rank=0, epoch=1)
    tf_kernel.stream_handshake([0], FAKE_PTR, rank=0, epoch=7, bits=32, stream=0)


def _phase(peers, local=FAKE_PTR, rank=0, bank=0, marker=0, token=0, stream=0, bits=32, wait_event=0, device=0):
    torch.ops.tf_kernel.stream_phase(
        list(peers), local, rank, len(peers), bank, marker, token, stream, bits, 0, wait_event, device
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(bits=16), r"bits must be 32 or 64, got 16"),
        (dict(bank=2), r"bank must be 0 or 1, got 2"),
        (dict(rank=2), r"rank must satisfy 0 <= rank < world_size \(2\), got 2"),
        (dict(marker=FAKE_PTR, token=0), r"token must be > 0 .*got 0"),
        (dict(marker=FAKE_PTR + 2), r"marker_ptr \(\d+\) must be 4-byte aligned"),
        (dict(marker=FAKE_PTR, token=1 << 33), r"value must fit in an unsigned 32-bit word"),
        (dict(local=0), r"local_flag_ptr is a null device address"),
        (dict(wait_event=-1), r"wait_event must be 0 \(none\)"),
        (dict(device=-1), r"device must be a CUDA device index"),
        (dict(stream=-2), r"stream must be a cudaStream_t"),
    ],
)
def test_phase_validates_before_any_cuda_call(kwargs, message):
    with pytest.raises(RuntimeError, match=r"tf_kernel.stream_phase: " + message):
        _phase([FAKE_PTR, FAKE_PTR], **kwargs)


def test_phase_peer_pointers_are_checked():
    with pytest.raises(RuntimeError, match=r"peer_flag_ptrs\[1\] is a null device address"):
        _phase([FAKE_PTR, 0], rank=0)
    _bad = [FAKE_PTR + 4, FAKE_PTR]
    with pytest.raises(RuntimeError, match=r"peer_flag_ptrs\[0\] \(\d+\) must be 8-byte aligned"):
        _phase(_bad, rank=1, bits=64)


@no_cuda
def test_phase_and_capture_query_without_driver_fail_clearly():
    with pytest.raises(RuntimeError, match=r"tf_kernel: "):
        tf_kernel.stream_phase([FAKE_PTR, FAKE_PTR], FAKE_PTR, rank=0, bank=1, stream=0, device=0)
    with pytest.raises(RuntimeError, match=r"tf_kernel: .*cudaStreamIsCapturing"):
        tf_kernel.stream_is_capturing(0)


# --------------------------------------------------------------------------------------
# CUDA IPC
# --------------------------------------------------------------------------------------
def _valid_looking_handle(offset=0):
    h = torch.zeros(72, dtype=torch.uint8)
    h[:64] = torch.arange(1, 65, dtype=torch.uint8)
    h[64:] = torch.tensor(list(offset.to_bytes(8, "little")), dtype=torch.uint8)
    return h


def test_ipc_get_handle_cpu_tensor():
    with pytest.raises(
        RuntimeError, match=r"tf_kernel.ipc_get_handle: tensor must be a CUDA tensor, got a tensor on cpu"
    ):
        tf_kernel.ipc_get_handle(torch.zeros(16))


def test_ipc_open_handle_wrong_device_dtype_size():
    with pytest.raises(RuntimeError, match=r"handle must have dtype torch.uint8, got Long"):
        tf_kernel.ipc_open_handle(torch.zeros(72, dtype=torch.int64))
    for n in (0, 64, 71, 73):
        with pytest.raises(RuntimeError, match=rf"handle must have exactly 72 bytes .* got {n}"):
            tf_kernel.ipc_open_handle(torch.ones(n, dtype=torch.uint8))


def test_ipc_open_handle_nbytes_must_be_non_negative():
    with pytest.raises(RuntimeError, match=r"tf_kernel.ipc_open_handle: nbytes must be >= 0"):
        torch.ops.tf_kernel.ipc_open_handle(_valid_looking_handle(offset=8), -1)


def test_ipc_open_handle_malformed():
    with pytest.raises(RuntimeError, match=r"malformed handle: the 64 cudaIpcMemHandle_t bytes are all zero"):
        tf_kernel.ipc_open_handle(torch.zeros(72, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"malformed handle: offset \d+ does not fit in int64"):
        tf_kernel.ipc_open_handle(_valid_looking_handle(offset=1 << 63))


@no_cuda
def test_ipc_open_handle_without_driver_fails_clearly():
    with pytest.raises(RuntimeError, match=r"cudaIpcOpenMemHandle failed: cuda"):
        tf_kernel.ipc_open_handle(_valid_looking_handle(offset=128))


def test_ipc_close_and_address_range_reject_null():
    with pytest.raises(RuntimeError, match=r"tf_kernel.ipc_close_handle: ptr must be a non-null device address"):
        tf_kernel.ipc_close_handle(0)
    with pytest.raises(RuntimeError, match=r"tf_kernel.get_address_range: ptr must be a non-null device address"):
        tf_kernel.get_address_range(-16)


def test_ipc_handle_offset_helper():
    assert tf_kernel.ipc_handle_offset(_valid_looking_handle(offset=123456789)) == 123456789
    with pytest.raises(ValueError):
        tf_kernel.ipc_handle_offset(torch.zeros(10, dtype=torch.uint8))


# --------------------------------------------------------------------------------------
# import-time build compatibility check
# --------------------------------------------------------------------------------------
def test_check_build_compatibility_accepts_match():
    check_build_compatibility({"torch_version": "2.11.0+cu130", "torch_cuda_version": "13.0"}, "2.11.0+cu130", "13.0")
    check_build_compatibility({"torch_version": "2.13.0+cpu", "torch_cuda_version": None}, "2.13.0+cpu", None)


def test_check_build_compatibility_torch_mismatch_names_both():
    with pytest.raises(ImportError) as ei:
        check_build_compatibility({"torch_version": "2.11.0+cu130", "torch_cuda_version": "13.0"}, "2.13.0+cpu", None)
    msg = str(ei.value)
    assert "2.11.0+cu130" in msg and "2.13.0+cpu" in msg
    assert "'13.0'" in msg and "None" in msg
    assert "make -C tf-kernel build-sm90" in msg


def test_check_build_compatibility_cuda_mismatch_names_both():
    with pytest.raises(ImportError, match=r"torch.version.cuda '12.8' at build time vs '13.0' now"):
        check_build_compatibility({"torch_version": "2.11.0", "torch_cuda_version": "12.8"}, "2.11.0", "13.0")


def test_check_build_compatibility_incomplete_info():
    with pytest.raises(ImportError, match="lacks torch_version"):
        check_build_compatibility({}, "2.13.0", None)


def _run_python(code, cwd, env=None):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_refuses_other_torch_before_loading(tmp_path):
    # Simulate running a different torch than the one recorded at build time: the import
    # must raise ImportError naming both versions, and the .so must not have been loaded.
    proc = _run_python(
        """
        import torch
        real = torch.__version__
        torch.__version__ = "0.0.1+simulated"
        try:
            import tf_kernel
        except ImportError as e:
            print("IMPORT-ERROR:", e)
        else:
            print("IMPORTED")
        print("LOADED:", any("tf_kernel" in p for p in torch.ops.loaded_libraries))
        print("REAL:", real)
        """,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "IMPORT-ERROR:" in out, out
    assert "0.0.1+simulated" in out and f"torch {torch.__version__} at build time" in out, out
    assert "LOADED: False" in out, out


def test_import_without_build_info_is_clear(tmp_path):
    # A source checkout (no generated _build_info.py, no .so) must fail with a build hint.
    pkg_src = os.path.dirname(os.path.abspath(tf_kernel.__file__))
    dst = tmp_path / "tf_kernel"
    dst.mkdir()
    for name in ("__init__.py", "_compat.py", "ops.py"):
        shutil.copy(os.path.join(pkg_src, name), dst / name)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = _run_python(
        """
        try:
            import tf_kernel
        except ImportError as e:
            print("IMPORT-ERROR:", e)
        """,
        cwd=str(tmp_path),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "IMPORT-ERROR: tf_kernel is not built" in proc.stdout, proc.stdout
    assert "make -C tf-kernel build-sm90" in proc.stdout
