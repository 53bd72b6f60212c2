"""The CUDA IPC copy-engine transport end to end, with 2 and 4 processes sharing one GPU (gloo control group).

The same rank functions as the CPU protocol suite (tests/transport_cases.py), here with tf-kernel's pitched copies,
stream-memory handshake and IPC mappings on a real GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import transport_cases as cases

# The transport under test: CUDA IPC by default (ranks share GPU 0); the multi-GPU runner also runs the suite with
# TELEFUSER_TEST_GPU_PER_RANK=1 and TELEFUSER_TEST_GPU_TRANSPORT=ce-symm (Symmetric Memory needs a GPU per rank).
T, DEV = os.environ.get("TELEFUSER_TEST_GPU_TRANSPORT", "ce-ipc"), "cuda"
GPU_PER_RANK = os.environ.get("TELEFUSER_TEST_GPU_PER_RANK") == "1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_exact_scatter_views_and_gather(gpu_ranks, dtype):
    assert gpu_ranks.run(cases.case_exact_scatter_and_views, T, DEV, dtype) == [T] * gpu_ranks.world_size


def test_64_grouped_iterations_with_rank_skew_reuse_targets(gpu_ranks):
    for distinct, alternates, stats in gpu_ranks.run(cases.case_grouped_reuse_and_stress, T, DEV, 64):
        assert all(len(p) == 2 for p in distinct.values()), distinct
        assert alternates
        assert stats == (3, 6, 64)


def test_cache_bound(gpu_ranks2):
    for (keys, evictions, tags), hit in gpu_ranks2.run(cases.case_cache_bound, T, DEV, 14):
        assert keys == 12 and evictions == 2 and tags == [f"t{i}" for i in range(2, 14)] and hit


def test_close_releases_ipc_handles(gpu_ranks2):
    for _, opened, message in gpu_ranks2.run(cases.case_close_releases, T, DEV):
        assert opened == 0 and "closed" in message


@pytest.mark.parametrize("fail_call", [1, 2], ids=["at_init", "at_first_grouped_submission"])
def test_agreed_fallback(gpu_ranks2, fail_call):
    for name, reasons in gpu_ranks2.run(cases.case_agreed_fallback, T, DEV, fail_call):
        assert name == "portable" and "injected failure" in reasons[T]


def test_failure_after_group_start(gpu_ranks2):
    for message, backend_after, later in gpu_ranks2.run(cases.case_failure_after_group_start, T, DEV):
        assert "after a grouped transfer started" in message and backend_after == T and "failed earlier" in later


def _auto_selection(ctx, hide_tf_kernel):
    if hide_tf_kernel:
        sys.modules["tf_kernel"] = None  # import fails as if the extension were not built
    try:
        comm = cases.make_comm(ctx, "auto", DEV)
        xs = cases.inputs_for(1, ctx.world_size, (1, 4, 2 * ctx.world_size, 8), torch.bfloat16, DEV)
        out = comm.scatter_heads(xs[ctx.rank]).wait()
        assert torch.equal(out.cpu(), cases.expected_scatter([x.cpu() for x in xs], ctx.rank))
        name, reasons = comm.backend_name, dict(comm.fallback_reasons)
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
           str(ROOT / "tests/gpu/ipc_lifecycle_script.py"), mode]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_missing_peer_ends_waiting_rank_with_clear_error():
    result = _run_script("missing-peer", timeout=120)
    assert result.returncode != 0
    assert "handshake epoch 4 did not complete within 3s" in result.stderr, result.stderr[-3000:]


def test_normal_exit_has_no_ipc_warnings():
    result = _run_script("normal", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok rank 0" in result.stdout and "ok rank 1" in result.stdout
    lowered = result.stderr.lower()
    assert "ipc" not in lowered and "leak" not in lowered, result.stderr[-3000:]
