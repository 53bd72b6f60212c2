"""GPU tests for tf_kernel (need a CUDA GPU; skipped otherwise). Run: make test-gpu PYTHON=...

Rules these tests follow (see shared/notes/gpu-facts.md):
* A stream only ever waits (cuStreamWaitValue) on values written earlier on the SAME stream,
  or written by ANOTHER PROCESS. Never by another stream of the same process: on the H200
  that was seen to deadlock.
* Completion is polled with a timeout (_finish) so that a wait that is never satisfied fails
  the test instead of hanging it; anything that is expected to block, or involves several
  processes, runs in subprocesses with a timeout.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import tf_kernel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_handshake_worker.py")


def _finish(stream, what, timeout_s=30.0):
    """Wait for `stream` with a timeout; fail (instead of hanging) if it never completes."""
    event = torch.cuda.Event()
    event.record(stream)
    deadline = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > deadline:
            pytest.fail(
                f"{what}: stream still busy after {timeout_s:.0f} s; a cuStreamWaitValue was never satisfied "
                "(the GPU stream stays blocked: restart the process before running more GPU work)"
            )
        time.sleep(0.001)


def _side_stream():
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # inputs were initialised on the current stream
    return s


def _run_script(code, timeout_s=180):
    """Run `code` in a fresh interpreter (outside the source tree); returns CompletedProcess."""
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"subprocess timed out after {timeout_s} s (a stream wait hung?)\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}"
        )


# --------------------------------------------------------------------------------------
# capabilities
# --------------------------------------------------------------------------------------
def test_capabilities_on_gpu():
    caps = tf_kernel.capabilities()
    assert caps["usable"], caps
    assert caps["cuda_driver_version"] >= 12000, caps
    assert caps["cuda_runtime_version"] >= 12000, caps
    assert caps["device_capability"] is not None
    assert caps["build"]["torch_cuda_version"] == torch.version.cuda


# --------------------------------------------------------------------------------------
# copy_2d
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,S,H,D,W", [(2, 33, 8, 64, 2), (1, 128, 40, 128, 4), (3, 17, 16, 128, 8)])
def test_copy_2d_ulysses_scatter_of_fused_v(dtype, B, S, H, D, W):
    """Strided V of fused [B,S,3,H,D] -> [B, S*W, H/W, D] per peer, exactly as torch indexing."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    hw = H // W
    qkvs = [torch.randn(B, S, 3, H, D, device=dev, dtype=dtype) for _ in range(W)]  # one per simulated rank
    outs = [torch.full((B, S * W, hw, D), float("nan"), device=dev, dtype=dtype) for _ in range(W)]
    stream = _side_stream()
    for r in range(W):
        v = qkvs[r][:, :, 2]  # [B, S, H, D] view, rows 3*H*D apart
        e = v.element_size()
        assert v.stride() == (S * 3 * H * D, 3 * H * D, D, 1)
        width = hw * D * e
        for p in range(W):  # rank r sends head group p to peer p, into rows [r*S, (r+1)*S)
            tf_kernel.copy_2d(
                v,
                outs[p],
                width_bytes=width,
                height=S,
                batch=B,
                src_offset_bytes=p * width,
                src_pitch_bytes=v.stride(1) * e,
                src_batch_stride_bytes=v.stride(0) * e,
                dst_offset_bytes=r * S * width,
                dst_pitch_bytes=width,
                dst_batch_stride_bytes=S * W * width,
                stream=stream,
            )
    _finish(stream, "copy_2d scatter")
    torch.cuda.current_stream().wait_stream(stream)
    for p in range(W):
        expected = torch.cat([qkvs[r][:, :, 2, p * hw : (p + 1) * hw, :] for r in range(W)], dim=1)
        assert torch.equal(outs[p], expected), f"peer {p}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_copy_2d_ulysses_inverse_gather(dtype):
    """Inverse exchange: [B, S*W, H/W, D] per rank -> [B, S, H, D] per peer (dst pitch > width)."""
    B, S, H, D, W = 2, 24, 16, 64, 4
    dev = torch.device("cuda")
    hw = H // W
    attn = [torch.randn(B, S * W, hw, D, device=dev, dtype=dtype) for _ in range(W)]  # rank r: heads r, full seq
    finals = [torch.full((B, S, H, D), float("nan"), device=dev, dtype=dtype) for _ in range(W)]
    e = attn[0].element_size()
    width = hw * D * e
    for r in range(W):
        for p in range(W):  # rank r sends sequence chunk p of its heads to peer p
            tf_kernel.copy_2d(
                attn[r],
                finals[p].data_ptr(),  # raw address form, capacity explicit
                dst_capacity_bytes=finals[p].numel() * e,
                width_bytes=width,
                height=S,
                batch=B,
                src_offset_bytes=p * S * width,
                src_pitch_bytes=width,
                src_batch_stride_bytes=S * W * width,
                dst_offset_bytes=r * width,
                dst_pitch_bytes=H * D * e,
                dst_batch_stride_bytes=S * H * D * e,
            )  # default: current stream
    torch.cuda.synchronize()
    for p in range(W):
        expected = torch.cat([attn[r][:, p * S : (p + 1) * S] for r in range(W)], dim=2)
        assert torch.equal(finals[p], expected), f"peer {p}"


def _scatter_copies(v, W, r, outs, width, S):
    """copy_2d_batch's list for rank r's scatter of `v` into every peer's output (raw addresses)."""
    e = v.element_size()
    flat = []
    for p in range(W):
        flat += [
            outs[p].data_ptr(),
            outs[p].numel() * e,
            p * width,
            v.stride(1) * e,
            v.stride(0) * e,
            r * S * width,
            width,
            S * W * width,
            width,
            S,
            v.shape[0],
        ]
    return flat


@pytest.mark.parametrize("layout", ["fused_v_view", "batch_stride_not_a_multiple_of_the_pitch"])
def test_copy_2d_batch_scatter_matches_torch_indexing(layout):
    """Every peer's pitched copy of one rank in one op (one cudaMemcpy3DBatchAsync where the runtime has it)."""
    B, S, H, D, W = 2, 33, 8, 64, 4
    dtype, hw = torch.bfloat16, H // W
    torch.manual_seed(1)
    if layout == "fused_v_view":
        srcs = [torch.randn(B, S, 3, H, D, device="cuda", dtype=dtype)[:, :, 2] for _ in range(W)]
    else:  # batch items 8 elements further apart than S rows: the 3-D form does not apply, one op per item
        srcs = [
            torch.randn(B * (S * H * D + 8), device="cuda", dtype=dtype).as_strided(
                (B, S, H, D), (S * H * D + 8, H * D, D, 1)
            )
            for _ in range(W)
        ]
    outs = [torch.full((B, S * W, hw, D), float("nan"), device="cuda", dtype=dtype) for _ in range(W)]
    width = hw * D * srcs[0].element_size()
    stream = _side_stream()
    for r in range(W):
        tf_kernel.copy_2d_batch(srcs[r], _scatter_copies(srcs[r], W, r, outs, width, S), stream=stream)
    _finish(stream, "copy_2d_batch scatter")
    torch.cuda.current_stream().wait_stream(stream)
    for p in range(W):
        expected = torch.cat([srcs[r][:, :, p * hw : (p + 1) * hw, :] for r in range(W)], dim=1)
        assert torch.equal(outs[p], expected), f"peer {p}"
    mode = tf_kernel.submission_modes()[0]
    print(f"copy_2d_batch mode: {mode} (1: one cudaMemcpy3DBatchAsync per call; 0: the runtime refused it)")
    assert mode in (0, 1)


def test_copy_2d_batch_reads_only_what_the_caller_stream_produced():
    """With a readiness event the copies wait for the caller stream: a slow producer still gives the final data."""
    n = 1 << 16
    src = torch.zeros(n, device="cuda")
    dst = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    producer, copier = torch.cuda.Stream(), torch.cuda.Stream()
    event = tf_kernel.event_create()
    try:
        with torch.cuda.stream(producer):
            torch.cuda._sleep(20_000_000)  # tens of ms: the copy would read zeros without the wait
            src.copy_(torch.arange(n, device="cuda", dtype=torch.float32) + 1)
        copies = [dst.data_ptr(), n * 4, 0, n * 4, 0, 0, n * 4, 0, n * 4, 1, 1]
        tf_kernel.copy_2d_batch(src, copies, stream=copier, wait_stream=producer, wait_event=event)
        _finish(copier, "copy_2d_batch after the producer")
        torch.cuda.synchronize()
    finally:
        tf_kernel.event_destroy(event)
    assert torch.equal(dst, torch.arange(n, device="cuda", dtype=torch.float32) + 1)


def test_stream_memop_support_on_gpu():
    memops32, memops64 = tf_kernel.stream_memop_support()
    assert memops32, "32-bit stream memory operations unavailable"
    print(f"64-bit stream memops: {memops64}")


def test_copy_2d_batch_zero_is_a_no_op():
    src = torch.randn(4, 16, device="cuda")
    dst = torch.zeros(4, 16, device="cuda")
    tf_kernel.copy_2d(src, dst, width_bytes=64, height=4, batch=0, src_pitch_bytes=64, dst_pitch_bytes=64)
    torch.cuda.synchronize()
    assert torch.count_nonzero(dst) == 0


def test_copy_2d_bounds_errors_on_gpu():
    B, S, H, D = 1, 8, 4, 32
    qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16)
    v = qkv[:, :, 2]
    e = v.element_size()
    out = torch.zeros(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    kw = dict(
        width_bytes=H * D * e,
        src_pitch_bytes=v.stride(1) * e,
        dst_pitch_bytes=H * D * e,
        src_batch_stride_bytes=v.stride(0) * e,
        dst_batch_stride_bytes=S * H * D * e,
        batch=B,
    )
    with pytest.raises(RuntimeError, match="source read out of bounds"):
        tf_kernel.copy_2d(v, out, height=S + 1, **kw)
    with pytest.raises(RuntimeError, match="destination write out of bounds"):
        tf_kernel.copy_2d(v, out.view(-1)[1:], height=S, **kw)  # capacity 2 bytes short
    with pytest.raises(RuntimeError, match=r"width_bytes \(\d+\) exceeds dst_pitch_bytes"):
        tf_kernel.copy_2d(v, out, height=S, **{**kw, "dst_pitch_bytes": H * D * e - 2})
    tf_kernel.copy_2d(v, out, height=S, **kw)  # the exact fit works
    torch.cuda.synchronize()
    assert torch.equal(out, v)


# --------------------------------------------------------------------------------------
# stream memory operations (same stream only)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [32, 64])
def test_write_then_wait_same_stream(bits):
    dtype = torch.int32 if bits == 32 else torch.int64
    flags = torch.zeros(4, dtype=dtype, device="cuda")
    s = _side_stream()
    addr = flags.data_ptr() + flags.element_size()
    tf_kernel.stream_write_value(addr, 7, bits=bits, stream=s)
    tf_kernel.stream_wait_value(addr, 7, bits=bits, stream=s)  # equal: satisfied
    tf_kernel.stream_wait_value(addr, 5, bits=bits, stream=s)  # GEQ: an older epoch is satisfied too
    tf_kernel.stream_write_value(addr + flags.element_size(), 9, bits=bits, stream=s.cuda_stream)  # int stream
    _finish(s, f"write/wait {bits}-bit")
    assert flags.tolist() == [0, 7, 9, 0]


def test_write_value_64bit_full_range():
    flags = torch.zeros(2, dtype=torch.int64, device="cuda")
    s = _side_stream()
    tf_kernel.stream_write_value(flags.data_ptr(), (1 << 40) + 3, bits=64, stream=s)
    tf_kernel.stream_write_value(flags.data_ptr() + 8, -2, bits=64, stream=s)
    _finish(s, "64-bit writes")
    assert flags.tolist() == [(1 << 40) + 3, -2]


def test_wait_geq_is_cyclic_for_32bit():
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    a = flags.data_ptr()
    s = _side_stream()
    tf_kernel.stream_write_value(a, 0xFFFFFFFE, bits=32, stream=s)
    tf_kernel.stream_wait_value(a, 0xFFFFFFFE, bits=32, stream=s)
    tf_kernel.stream_write_value(a, 1, bits=32, stream=s)  # epoch wrapped past 2**32
    tf_kernel.stream_wait_value(a, 0xFFFFFFFF, bits=32, stream=s)  # (int32)(1 - 0xFFFFFFFF) = 2 >= 0
    tf_kernel.stream_wait_value(a, 0, bits=32, stream=s)
    _finish(s, "cyclic 32-bit wait")
    assert flags[0].item() == 1


def test_wait_blocks_until_value_reached():
    """A wait really blocks, is released by a larger value (GEQ), not by a smaller one.

    The flag is pinned host memory (its host address is also its device address under UVA),
    so the host can release the wait without any other stream. Runs in a subprocess: if the
    wait were never released, only that process would hang (and be killed).
    """
    proc = _run_script(
        """
        import time, torch, tf_kernel
        flag = torch.zeros(2, dtype=torch.int64, pin_memory=True)
        dst = torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        tf_kernel.stream_wait_value(flag.data_ptr(), 3, bits=64, stream=s)
        with torch.cuda.stream(s):
            dst.fill_(1.0)  # queued behind the wait
        ev = torch.cuda.Event()
        ev.record(s)
        time.sleep(0.3)
        print("BLOCKED_INITIALLY", not ev.query())
        flag[0] = 2
        time.sleep(0.3)
        print("BLOCKED_AT_2", not ev.query())
        flag[0] = 5
        deadline = time.monotonic() + 20
        while not ev.query() and time.monotonic() < deadline:
            time.sleep(0.001)
        released = ev.query()
        print("RELEASED_AT_5", released)
        if released:
            print("DST", dst.item())
        else:
            import os
            os._exit(3)
        """
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BLOCKED_INITIALLY True" in proc.stdout, proc.stdout
    assert "BLOCKED_AT_2 True" in proc.stdout, proc.stdout
    assert "RELEASED_AT_5 True" in proc.stdout, proc.stdout
    assert "DST 1.0" in proc.stdout, proc.stdout


# --------------------------------------------------------------------------------------
# stream_handshake (in one process: every wait is satisfied by an earlier op of the same stream)
# --------------------------------------------------------------------------------------
def test_handshake_world_size_one_is_trivially_done():
    flags = torch.zeros(1, dtype=torch.int64, device="cuda")
    s = _side_stream()
    tf_kernel.stream_handshake([flags.data_ptr()], flags.data_ptr(), rank=0, epoch=1, stream=s)
    _finish(s, "world_size=1 handshake")
    assert flags.tolist() == [0]


@pytest.mark.parametrize(
    "bits,epochs",
    [
        (64, [1, 2, 3]),
        (32, [1, 2, 3]),
        (32, [2**32 - 1, 2**32, 2**32 + 1]),  # low 32 bits: 0xFFFFFFFF, 0, 1 (wraparound)
        (64, [2**40, 2**40 + 1]),
    ],
)
def test_handshake_two_ranks_on_one_stream(bits, epochs):
    dtype = torch.int32 if bits == 32 else torch.int64
    e = bits // 8
    mask = (1 << bits) - 1
    A = torch.zeros(2, dtype=dtype, device="cuda")  # rank 0's local flag array
    B = torch.zeros(2, dtype=dtype, device="cuda")  # rank 1's local flag array
    if epochs[0] > 1:  # start from the previous epoch, as a long-running job would be
        prev = (epochs[0] - 1) & mask
        signed = prev - (1 << bits) if prev >= (1 << (bits - 1)) else prev
        A.fill_(signed)
        B.fill_(signed)
    peers = [A.data_ptr(), B.data_ptr()]
    s = _side_stream()
    for epoch in epochs:
        # Rank 1's publish into rank 0's slot 1 "arrives first" (a raw write, same stream).
        tf_kernel.stream_write_value(A.data_ptr() + 1 * e, epoch & mask, bits=bits, stream=s)
        # Rank 0: publishes into B[0], then waits on A[1] (already >= epoch in stream order).
        tf_kernel.stream_handshake(peers, A.data_ptr(), rank=0, epoch=epoch, bits=bits, stream=s)
        # Rank 1: publishes into A[1], then waits on B[0] (written by rank 0 just above).
        tf_kernel.stream_handshake(peers, B.data_ptr(), rank=1, epoch=epoch, bits=bits, stream=s)
    _finish(s, f"two-rank handshake, {bits}-bit, epochs {epochs}")
    assert tf_kernel.submission_modes()[1] in (0, 1)  # one cuStreamBatchMemOp per handshake, or one call per memop
    last = epochs[-1] & mask
    first = ((epochs[0] - 1) & mask) if epochs[0] > 1 else 0
    # Each rank's slot for the peer holds the last epoch; its own slot is never written.
    assert [x & mask for x in A.tolist()] == [first, last]
    assert [x & mask for x in B.tolist()] == [last, first]


# --------------------------------------------------------------------------------------
# CUDA IPC
# --------------------------------------------------------------------------------------
def _expandable_segments():
    return "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()


@pytest.mark.skipif(_expandable_segments(), reason="cudaIpcGetMemHandle does not support expandable segments")
def test_ipc_get_handle_offset_of_a_slice():
    big = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    t = big[12345:]
    handle = tf_kernel.ipc_get_handle(t)
    assert handle.dtype == torch.uint8 and handle.device.type == "cpu" and handle.numel() == 72
    assert torch.count_nonzero(handle[:64]) > 0
    base, size = tf_kernel.get_address_range(t.data_ptr())
    assert base <= big.data_ptr() and t.data_ptr() + t.numel() <= base + size
    assert tf_kernel.ipc_handle_offset(handle) == t.data_ptr() - base
    assert tf_kernel.ipc_handle_offset(tf_kernel.ipc_get_handle(big)) == big.data_ptr() - base
    # Cross-check the allocation base with torch's caching allocator: its segments are the
    # cudaMalloc allocations that cuMemGetAddressRange reports.
    segments = [
        seg
        for seg in torch.cuda.memory_snapshot()
        if seg["address"] <= t.data_ptr() < seg["address"] + seg["total_size"]
    ]
    assert len(segments) == 1
    assert segments[0]["address"] == base and size >= segments[0]["total_size"]


@pytest.mark.skipif(_expandable_segments(), reason="cudaIpcGetMemHandle does not support expandable segments")
def test_ipc_open_write_close_from_another_process():
    """Another process opens our buffer, copies into it with copy_2d, publishes a flag, closes."""
    big = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()  # zeroes are in place before the peer writes
    handle = tf_kernel.ipc_get_handle(big)
    n = 8192
    proc = _run_script(
        f"""
        import torch, tf_kernel
        h = torch.tensor(list(bytes.fromhex("{bytes(handle.tolist()).hex()}")), dtype=torch.uint8)
        try:
            tf_kernel.ipc_open_handle(h, nbytes=1 << 40)  # more than the allocation holds past the offset
            raise SystemExit("an IPC mapping too small for nbytes was accepted")
        except RuntimeError as exc:
            assert "lies outside the opened allocation" in str(exc), exc
        ptr = tf_kernel.ipc_open_handle(h, nbytes={1 << 20})
        base, size = tf_kernel.get_address_range(ptr)
        assert ptr - base == tf_kernel.ipc_handle_offset(h), (ptr, base)
        src = (torch.arange({n}, device="cuda") % 251).to(torch.uint8)
        tf_kernel.copy_2d(src, ptr, dst_capacity_bytes={1 << 20}, dst_offset_bytes=4096,
                          width_bytes={n}, height=1, src_pitch_bytes={n}, dst_pitch_bytes={n})
        tf_kernel.stream_write_value(ptr + 8, 42, bits=64)  # after the copy, same stream
        torch.cuda.synchronize()
        tf_kernel.ipc_close_handle(ptr)
        print("CHILD-OK")
        """
    )
    assert proc.returncode == 0 and "CHILD-OK" in proc.stdout, proc.stdout + proc.stderr
    torch.cuda.synchronize()
    expected = (torch.arange(n, device="cuda") % 251).to(torch.uint8)
    assert torch.equal(big[4096 : 4096 + n], expected)
    assert big[8:16].view(torch.int64).item() == 42
    assert torch.count_nonzero(big[:8]) == 0 and torch.count_nonzero(big[16:4096]) == 0
    assert torch.count_nonzero(big[4096 + n :]) == 0


@pytest.mark.skipif(_expandable_segments(), reason="cudaIpcGetMemHandle does not support expandable segments")
@pytest.mark.parametrize("bits,epoch_base", [(64, 0), (32, 2**32 - 20)])
def test_two_process_copy_and_handshake(tmp_path, bits, epoch_base):
    """Two processes on one GPU: copy to the peer, publish the epoch, wait for the peer's.

    With bits=32 the epochs cross 2**32 (the flags start at the previous epoch). Rank 0
    sleeps on its stream every few rounds, so the ranks drift apart.
    """
    world, rounds = 2, 48
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                WORKER,
                f"--rank={r}",
                f"--world={world}",
                f"--dir={tmp_path}",
                f"--rounds={rounds}",
                f"--bits={bits}",
                f"--epoch-base={epoch_base}",
            ],
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("two-process handshake timed out (a stream wait hung?)")
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"RANK {r} OK" in out, f"rank {r} rc={p.returncode}\n{out}"


# --------------------------------------------------------------------------------------
# CUDA graph capture: batched copies become per-copy nodes; a phase with a host marker
# --------------------------------------------------------------------------------------
def test_copy_2d_batch_under_capture_records_per_copy_nodes_and_replays_exactly():
    src = torch.randn(2, 8, 6, 16, device="cuda")  # [B, S, H, D]; copy heads 2..3 of every row, pitched
    dst = torch.full((2, 8, 2, 16), -1.0, device="cuda")
    e = src.element_size()
    one = [dst.data_ptr(), dst.numel() * e, 2 * 16 * e, 6 * 16 * e, 8 * 6 * 16 * e, 0, 2 * 16 * e, 8 * 2 * 16 * e,
           2 * 16 * e, 8, 2]  # fmt: skip
    stream = _side_stream()
    tf_kernel.copy_2d_batch(src, one, stream=stream)
    _finish(stream, "eager batched copy")
    assert torch.equal(dst, src[:, :, 2:4])
    graph = torch.cuda.CUDAGraph()
    capture_stream = torch.cuda.Stream()
    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=capture_stream):
        assert tf_kernel.stream_is_capturing(capture_stream)
        tf_kernel.copy_2d_batch(src, one, stream=capture_stream)
    assert not tf_kernel.stream_is_capturing(capture_stream)
    for _ in range(3):
        src.copy_(torch.randn_like(src))
        dst.fill_(-1.0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(dst, src[:, :, 2:4])


@pytest.mark.parametrize("bits", [32, 64])
def test_phase_writes_its_host_marker_eagerly_and_in_a_replayed_graph(bits):
    """A world of one (no peer to wait for): only the marker words are written, into pinned host memory."""
    dtype = torch.int32 if bits == 32 else torch.int64
    marker = torch.zeros(2, dtype=dtype, pin_memory=True)
    flags = torch.zeros(2, dtype=dtype, device="cuda")
    stream = _side_stream()
    tf_kernel.stream_phase([0], flags.data_ptr(), rank=0, bank=1, marker_ptr=marker.data_ptr(), token=41,
                           bits=bits, stream=stream)  # fmt: skip
    _finish(stream, "eager phase")
    assert marker.tolist() == [41, 41]
    graph = torch.cuda.CUDAGraph()
    capture_stream = torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=capture_stream):
        tf_kernel.stream_phase([0], flags.data_ptr(), rank=0, bank=0, marker_ptr=marker.data_ptr(), token=7,
                               bits=bits, stream=capture_stream)  # fmt: skip
    assert marker.tolist() == [41, 41]  # a capture records, it does not run
    marker.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert marker.tolist() == [7, 7] and flags.tolist() == [0, 0]
