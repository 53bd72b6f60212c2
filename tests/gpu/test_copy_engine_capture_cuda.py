"""The copy engine inside CUDA graphs, with 2 and 4 processes sharing the GPU (gloo control group, CUDA IPC): groups
captured with `torch.cuda.graph` and replayed with `CUDAGraph.replay()`, the rank functions of the CPU suite
(tests/capture_cases.py). The dead-peer case is in test_copy_engine_cuda.py (it needs its own processes)."""

from __future__ import annotations

import os

import pytest

from tests import capture_cases as cases

pytestmark = pytest.mark.tf_kernel

T, DEV = os.environ.get("TELEFUSER_TEST_GPU_TRANSPORT", "ce-ipc"), "cuda"


def test_100_replays_exact_with_a_rank_late_before_producing_and_another_before_consuming(gpu_ranks):
    for name, wrong, groups_issued in gpu_ranks.run(cases.case_replays_exact_with_delayed_ranks, T, DEV, 100):
        assert name == T and wrong == {} and groups_issued == 0


def test_eager_replays_and_a_new_session_interleave_exactly(gpu_ranks):
    for name, wrong in gpu_ranks.run(cases.case_eager_replay_and_new_session_interleaved, T, DEV):
        assert name == T and wrong == []


def test_what_cannot_be_recorded_is_refused_on_every_rank(gpu_ranks2):
    cases.check_refusals(gpu_ranks2.run(cases.case_capture_refusals, T, DEV))


def test_negative_control_a_captured_epoch_handshake_corrupts_replays(gpu_ranks2):
    """The one-phase epoch handshake replayed as captured lets a rank read before a late peer delivered."""
    corrupted = gpu_ranks2.run(cases.case_stale_epochs_corrupt, T, DEV, 100)
    print(f"replays with wrong data, per rank: {corrupted}")
    # Which rank reads early depends on how the processes share the GPU: on the H200 rank 0 read wrong data in 50+ of
    # 100 replays in one run and fewer in another; the positive twin reads none in 100, with the same delays.
    assert sum(corrupted) >= 20, corrupted
