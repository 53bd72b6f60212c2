"""The copy-engine protocol (cache, double buffers, handshake phases, grouping, agreed fallback, failure semantics, timeouts,
probe, reset, close) on CPU ranks, through the host shared-memory mapping and synchronous host primitives."""

from __future__ import annotations

import pytest
import torch

from tools.harness import transport_cases as cases

T, DEV = "host-shm", "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_exact_scatter_views_and_gather(ranks, dtype):
    assert ranks.run(cases.case_exact_scatter_and_views, T, DEV, dtype) == ["host-shm"] * ranks.world_size


def test_unreadable_layouts_are_packed_locally(ranks):
    assert ranks.run(cases.case_layouts_packed_locally, T, DEV) == ["host-shm"] * ranks.world_size


def test_grouped_stress_with_skew_reuses_two_buffers_per_tag(ranks):
    for distinct, alternates, stats in ranks.run(cases.case_grouped_reuse_and_stress, T, DEV, 64):
        assert all(len(p) == 2 for p in distinct.values()), distinct
        assert alternates
        keys, allocations, groups = stats
        assert (keys, allocations, groups) == (3, 6, 64)  # one handshake (open + close) per group of three


def test_cache_is_bounded_lru(ranks2):
    for (keys, evictions, tags, _), hit in ranks2.run(cases.case_cache_bound, T, DEV, 14):
        assert keys == 12 and evictions == 2
        assert tags == [f"t{i}" for i in range(2, 14)]
        assert hit


def test_cache_is_bounded_in_bytes(ranks2):
    # fp16 targets [1, 2*(2+i), 1, 8] at W=2: 2 buffers x 64*(2+i) bytes; a 2 KiB bound holds the newest few only
    bound = 2048
    for (keys, evictions, tags, cached), hit in ranks2.run(cases.case_cache_bound, T, DEV, 8, max_target_bytes=bound):
        assert cached <= bound and evictions > 0 and hit
        sizes = [2 * 2 * (2 + int(t[1:])) * 8 * 2 for t in tags]
        assert sum(sizes) == cached and tags[-1] == "t7"


def test_close_releases_everything(ranks2):
    for name, before, after, message in ranks2.run(cases.case_close_releases, T, DEV):
        assert name == "host-shm" and before > 0 and after == 0
        assert "closed" in message


@pytest.mark.parametrize("fail_call", [1, 2, cases.FIRST_TARGET_CALL], ids=["flags", "probe", "first_target"])
def test_setup_failure_on_one_rank_falls_back_on_all(ranks, fail_call):
    for name, reasons in ranks.run(cases.case_agreed_fallback, T, DEV, fail_call):
        assert name == "portable"
        assert "injected failure" in reasons["host-shm"]


@pytest.mark.parametrize("fail_at", [1, 3], ids=["at_flags", "at_first_target"])
def test_out_of_memory_on_one_rank_falls_back_on_all(ranks2, fail_at):
    results = ranks2.run(cases.case_oom_on_one_rank, T, DEV, fail_at, 1)
    for name, reasons, exact in results:
        assert name == "portable" and exact
        assert "rank 1: OutOfMemoryError: CUDA out of memory" in reasons["host-shm"], reasons
        assert "more lines" not in reasons["host-shm"]  # one line per rank in the agreed message
    assert results[0][1] == results[1][1]


def test_probe_wrong_data_falls_back_on_all(ranks2):
    results = ranks2.run(cases.case_probe_catches_wrong_data, T, DEV, 1)
    for name, reasons, exact in results:
        assert name == "portable" and exact
        assert "probe transfer delivered wrong data from ranks [1]" in reasons["host-shm"], reasons


def test_failure_after_group_start_raises_everywhere(ranks):
    for message, backend_after, later in ranks.run(cases.case_failure_after_group_start, T, DEV):
        assert "after a grouped transfer started" in message and "cannot safely fall back" in message
        assert backend_after == "host-shm"  # no switch of protocol mid-group
        assert "failed earlier" in later and "reset()" in later


def test_reset_reopens_the_copy_engine_for_the_next_request(ranks2):
    for failed_on, refused, did_reset, healthy_again, request2 in ranks2.run(
        cases.case_reset_reopens_copy_engine, T, DEV
    ):
        assert failed_on == "host-shm" and "failed earlier" in refused
        assert did_reset is True and healthy_again is False
        assert request2 == "host-shm"


def test_reset_after_an_agreed_fallback_retries_the_copy_engine(ranks2):
    for after_fallback, did_reset, now in ranks2.run(cases.case_reset_after_fallback, T, DEV):
        assert (after_fallback, did_reset, now) == ("portable", True, "host-shm")


def test_missing_peer_gives_timeout_error(ranks):
    results = ranks.run(cases.case_missing_peer_times_out, T, DEV, 1.5)
    assert results[-1] == "skipped K"
    for message, elapsed in results[:-1]:
        group = 2 + cases.PROBE_GROUPS
        assert f"peers [{ranks.world_size - 1}] did not complete the close phase of handshake group {group}" in message
        assert 1.5 <= elapsed < 10


def test_validation_is_still_agreed(ranks2):
    messages = ranks2.run(cases.case_agreed_input_error, T, DEV)
    assert len(set(messages)) == 1 and "rank 1: scatter_heads: dtype float64" in messages[0]


@pytest.mark.parametrize(
    "options, groups, allocations",
    [
        ({"pitched": False}, 3, 6),
        ({"handshake_per_tensor": True}, 9, 6),
        ({"cache_targets": False}, 3, 9),
        ({"flag_bits": 32, "high_priority_stream": False}, 3, 6),
    ],
    ids=["pack_then_flat", "handshake_per_tensor", "no_target_cache", "flags32_normal_priority"],
)
def test_ablation_options_stay_exact(ranks2, options, groups, allocations):
    for name, done, allocs in ranks2.run(cases.case_options_exact, T, DEV, options):
        assert (name, done, allocs) == ("host-shm", groups, allocations)
