"""The copy engine recorded into a graph and replayed, on CPU ranks: the host primitives' capture stands in for a
CUDA graph (the same rank functions run under `torch.cuda.graph` in tests/gpu), so the protocol's replay behaviour,
the two handshake phases with constant flags, and the capture rules run in CI."""

from __future__ import annotations

from tests import capture_cases as cases

T, DEV = "host-shm", "cpu"


def test_replays_are_exact_with_delayed_ranks(ranks):
    for name, wrong, groups_issued in ranks.run(cases.case_replays_exact_with_delayed_ranks, T, DEV, 20):
        assert name == T and wrong == {} and groups_issued == 0


def test_eager_replays_and_a_new_session_interleave_exactly(ranks2):
    for name, wrong in ranks2.run(cases.case_eager_replay_and_new_session_interleaved, T, DEV):
        assert name == T and wrong == []


def test_what_cannot_be_recorded_is_refused_on_every_rank(ranks2):
    cases.check_refusals(ranks2.run(cases.case_capture_refusals, T, DEV))


def test_negative_control_a_captured_epoch_handshake_corrupts_replays(ranks2):
    """The one-phase epoch handshake, replayed as captured, lets a rank read before a late peer delivered."""
    corrupted = ranks2.run(cases.case_stale_epochs_corrupt, T, DEV, 20)
    assert corrupted[0] >= 10, corrupted  # rank 0 is on time and reads rank 1's rows before they arrive
