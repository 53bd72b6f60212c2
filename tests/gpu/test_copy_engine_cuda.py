"""The copy-engine transport end to end on a real GPU, with 2 and 4 processes (gloo control group).

The same rank functions as the CPU protocol suite (tools/harness/transport_cases.py), here with tf-kernel's batched
pitched copies, stream-memory handshake and the mapping of the transport under test: CUDA IPC by default (ranks share
GPU 0); the multi-GPU runner also runs the suite with TELEFUSER_TEST_GPU_PER_RANK=1 and
TELEFUSER_TEST_GPU_TRANSPORT=ce-symm (Symmetric Memory needs a GPU per rank). Failure injection wraps that transport's
own mapping."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tools.harness import transport_cases as cases

pytestmark = pytest.mark.tf_kernel  # the copy engine's device ops

T, DEV = os.environ.get("TELEFUSER_TEST_GPU_TRANSPORT", "ce-ipc"), "cuda"
GPU_PER_RANK = os.environ.get("TELEFUSER_TEST_GPU_PER_RANK") == "1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_exact_scatter_views_and_gather(gpu_ranks, dtype):
    assert gpu_ranks.run(cases.case_exact_scatter_and_views, T, DEV, dtype) == [T] * gpu_ranks.world_size


def test_unreadable_layouts_are_packed_locally(gpu_ranks2):
    assert gpu_ranks2.run(cases.case_layouts_packed_locally, T, DEV) == [T] * 2


def test_64_grouped_iterations_with_rank_skew_reuse_targets(gpu_ranks):
    for distinct, alternates, stats in gpu_ranks.run(cases.case_grouped_reuse_and_stress, T, DEV, 64):
        assert all(len(p) == 2 for p in distinct.values()), distinct
        assert alternates
        assert stats == (3, 6, 64)


def test_cache_bound(gpu_ranks2):
    for (keys, evictions, tags, _), hit in gpu_ranks2.run(cases.case_cache_bound, T, DEV, 14):
        assert keys == 12 and evictions == 2 and tags == [f"t{i}" for i in range(2, 14)] and hit


def test_cache_byte_bound(gpu_ranks2):
    for (_, evictions, tags, cached), hit in gpu_ranks2.run(cases.case_cache_bound, T, DEV, 8, max_target_bytes=2048):
        assert cached <= 2048 and evictions > 0 and tags[-1] == "t7" and hit


def test_close_releases_what_the_mapping_holds(gpu_ranks2):
    for name, before, after, message in gpu_ranks2.run(cases.case_close_releases, T, DEV):
        assert name == T and before > 0 and after == 0 and "closed" in message


@pytest.mark.parametrize("fail_call", [1, 2, cases.FIRST_TARGET_CALL], ids=["flags", "probe", "first_target"])
def test_agreed_fallback(gpu_ranks2, fail_call):
    for name, reasons in gpu_ranks2.run(cases.case_agreed_fallback, T, DEV, fail_call):
        assert name == "portable" and "injected failure" in reasons[T]


def test_out_of_memory_on_one_rank_falls_back_on_all(gpu_ranks2):
    results = gpu_ranks2.run(cases.case_oom_on_one_rank, T, DEV, cases.FIRST_TARGET_CALL, 1)
    for name, reasons, exact in results:
        assert name == "portable" and exact and "rank 1: OutOfMemoryError" in reasons[T], reasons
    assert results[0][1] == results[1][1]


def test_probe_wrong_data_falls_back_on_all(gpu_ranks2):
    for name, reasons, exact in gpu_ranks2.run(cases.case_probe_catches_wrong_data, T, DEV, 1):
        assert name == "portable" and exact and "probe transfer delivered wrong data from ranks [1]" in reasons[T]


def test_failure_after_group_start(gpu_ranks2):
    for message, backend_after, later in gpu_ranks2.run(cases.case_failure_after_group_start, T, DEV):
        assert "after a grouped transfer started" in message and backend_after == T and "failed earlier" in later


def test_reset_reopens_the_copy_engine(gpu_ranks2):
    for failed_on, refused, did_reset, healthy_again, request2 in gpu_ranks2.run(
        cases.case_reset_reopens_copy_engine, T, DEV
    ):
        assert (failed_on, did_reset, healthy_again, request2) == (T, True, False, T) and "failed earlier" in refused


def _closed_rank_memory_is_not_reused(ctx):
    """Rank 0 closes while rank 1 still holds its mapping and writes into rank 0's old target afterwards: the
    memory must not have gone back to rank 0's allocator (the new tensor there would be overwritten)."""
    import torch.distributed as dist

    from telefuser.distributed.ulysses.mapping_ipc import parked_bytes

    w, r = ctx.world_size, ctx.rank
    comm = cases.make_comm(ctx, "ce-ipc", DEV)
    xs = cases.inputs_for(950, w, (1, 64, 2 * w, 64), torch.float32, DEV)
    comm.scatter_heads(xs[r], tag="v").wait()
    torch.cuda.synchronize()
    backend = comm.scatter_backend
    key = backend.cached_keys[0]
    slot = backend._targets[key].slots[0]
    target_ptr, nbytes = slot.local.data_ptr(), slot.capacity_bytes
    peer_ptr = slot.peers[0]  # on rank 1: where rank 0's buffer is mapped
    dist.barrier()
    result = None
    if r == 0:
        comm.close()  # local: rank 1 may still write
        fresh = [torch.full((nbytes // 4,), 7.0, device="cuda") for _ in range(4)]  # the allocator's next blocks
        torch.cuda.synchronize()
    dist.barrier()
    if r == 1:  # a late write through the still-open mapping into rank 0's old target
        junk = torch.full((nbytes // 4,), -1.0, device="cuda")
        backend.prims.copy_2d(junk, peer_ptr, nbytes, _flat(nbytes), backend.stream)
        backend.stream.synchronize()
    dist.barrier()
    if r == 0:
        torch.cuda.synchronize()
        intact = all(bool((f == 7.0).all()) for f in fresh)
        reused = any(f.data_ptr() == target_ptr for f in fresh)
        result = (intact, reused, parked_bytes() >= nbytes)
    else:
        comm.close()
    dist.barrier()
    return result


def _flat(nbytes):
    from telefuser.distributed.ulysses.layout import PitchedCopy

    return PitchedCopy(0, nbytes, 0, 0, nbytes, 0, nbytes, 1, 1)


@pytest.mark.skipif(T != "ce-ipc", reason="CUDA IPC's own lifetime rule (Symmetric Memory keeps its own)")
def test_a_local_close_parks_exported_memory_while_peers_may_write(gpu_ranks2):
    intact, reused, parked = gpu_ranks2.run(_closed_rank_memory_is_not_reused)[0]
    assert intact and not reused and parked


def _auto_selection(ctx, hide_tf_kernel):
    if hide_tf_kernel:
        sys.modules["tf_kernel"] = None  # import fails as if the extension were not built
    try:
        comm = cases.make_comm(ctx, "auto", DEV)
        xs = cases.inputs_for(1, ctx.world_size, (1, 4, 2 * ctx.world_size, 8), torch.bfloat16, DEV)
        out = comm.scatter_heads(xs[ctx.rank]).wait()
        assert torch.equal(out.cpu(), cases.expected_scatter([x.cpu() for x in xs], ctx.rank))
        name, reasons = comm.transport, dict(comm.fallback_reasons)
        comm.close()
        return name, reasons
    finally:
        if hide_tf_kernel:
            del sys.modules["tf_kernel"]


def test_auto_picks_ipc_when_ranks_share_a_gpu(gpu_ranks2):
    for name, reasons in gpu_ranks2.run(_auto_selection, False):
        if GPU_PER_RANK:  # one GPU per rank: Symmetric Memory is eligible and preferred
            assert name == "ce-symm", reasons
            continue
        assert name == "ce-ipc"
        assert "share a GPU" in reasons["ce-symm"] or "2.11" in reasons["ce-symm"]


def test_falls_back_when_operators_are_missing(gpu_ranks2):
    for name, reasons in gpu_ranks2.run(_auto_selection, True):
        assert name == "portable" and "tf-kernel is not importable" in reasons["ce-ipc"]


def _run_script(mode: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "tests/gpu/ipc_lifecycle_script.py"), mode]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_missing_peer_ends_waiting_rank_with_clear_error():
    result = _run_script("missing-peer", timeout=120)
    assert result.returncode != 0
    # 1 probe + 3 warm groups: the group the last rank never completes is group 5; it opened (both sent V)
    assert "the close phase of handshake group 5" in result.stderr, result.stderr[-3000:]
    assert "did not complete within 3s of the copy stream reaching it" in result.stderr, result.stderr[-3000:]


def test_dead_peer_under_replay_ends_the_waiting_rank_within_the_timeout():
    t0 = time.monotonic()
    result = _run_script("dead-peer-replay", timeout=120)
    assert result.returncode != 0 and time.monotonic() - t0 < 90
    # 1 probe + 3 warm groups + 2 captured: the replay's first group (5) never opens
    assert "the open phase of handshake group 5" in result.stderr, result.stderr[-3000:]
    assert "a CUDA graph replay" in result.stderr, result.stderr[-3000:]


def test_gpu_backlog_before_the_handshake_is_not_a_dead_peer():
    result = _run_script("backlog", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok rank 0" in result.stdout and "ok rank 1" in result.stdout, result.stdout


def test_normal_exit_has_no_ipc_warnings():
    result = _run_script("normal", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok rank 0" in result.stdout and "ok rank 1" in result.stdout
    lowered = result.stderr.lower()
    assert "ipc" not in lowered and "leak" not in lowered, result.stderr[-3000:]
