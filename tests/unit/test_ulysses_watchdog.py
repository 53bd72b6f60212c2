"""The handshake watchdog on a host marker written by the test (CPU) as the copy stream writes it on a GPU: its
clock starts when a phase is reached, phases that pass (eager or replayed, same tokens again) never count, and it
reports its own failures instead of dying silently."""

from __future__ import annotations

import time

import torch

from telefuser.distributed.ulysses.watchdog import HandshakeWatchdog


def _watchdog(timeout_s: float):
    fired: list[str] = []
    marker = torch.zeros(2, dtype=torch.int64)
    watchdog = HandshakeWatchdog(0, timeout_s, on_timeout=fired.append, poll_s=0.005)
    watchdog.attach(marker)
    return watchdog, marker, fired


def _reach(marker: torch.Tensor, token: int) -> None:
    marker[0], marker[1] = token, 0  # the order the copy stream writes them in


def _pass(marker: torch.Tensor, token: int) -> None:
    marker[1] = token


def _wait_until(condition, limit_s: float = 3.0) -> None:
    t0 = time.monotonic()
    while not condition() and time.monotonic() - t0 < limit_s:
        time.sleep(0.005)


def test_a_backlog_before_the_phase_does_not_count():
    watchdog, marker, fired = _watchdog(0.2)
    _reach(marker, 1)
    _pass(marker, 1)
    time.sleep(0.6)  # the copy stream is behind earlier GPU work three timeouts long: it never reached phase 2
    _reach(marker, 2)
    time.sleep(0.05)
    _pass(marker, 2)
    time.sleep(0.05)
    watchdog.close()
    assert fired == []


def test_a_stalled_phase_fires_about_one_timeout_after_it_was_reached():
    watchdog, marker, fired = _watchdog(0.2)
    _reach(marker, 5)
    t0 = time.monotonic()
    _wait_until(lambda: bool(fired))
    watchdog.close()
    assert fired and "the open phase of handshake group 3" in fired[0], fired
    assert "did not complete within 0.2s of the copy stream reaching it" in fired[0]
    assert 0.18 <= time.monotonic() - t0 < 1.5


def test_replayed_phases_that_pass_never_fire():
    """A graph replays the same captured tokens again and again; each passes quickly: never a stall."""
    watchdog, marker, fired = _watchdog(0.1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:
        for token in (7, 8, 9, 10):  # two captured groups, replayed
            _reach(marker, token)
            time.sleep(0.002)
            _pass(marker, token)
    watchdog.close()
    assert fired == []


def test_a_phase_stalled_under_replay_fires():
    watchdog, marker, fired = _watchdog(0.15)
    for _ in range(20):
        _reach(marker, 9)
        _pass(marker, 9)
    _reach(marker, 10)  # the replay's close phase never completes: a peer died
    _wait_until(lambda: bool(fired))
    watchdog.close()
    assert len(fired) == 1 and "the close phase of handshake group 5" in fired[0], fired


def test_a_failing_read_is_reported_not_swallowed():
    fired: list[str] = []
    watchdog = HandshakeWatchdog(0, 0.2, on_timeout=fired.append, poll_s=0.005)
    watchdog.attach(torch.zeros(2, dtype=torch.bfloat16))  # numpy cannot view bf16: the thread fails at once
    _wait_until(lambda: watchdog.error is not None)
    watchdog.close()
    assert watchdog.error is not None and "TypeError" in watchdog.error, watchdog.error
    assert fired == []


def test_close_stops_the_thread_promptly():
    watchdog, _, _ = _watchdog(600.0)
    t0 = time.monotonic()
    watchdog.close()
    assert time.monotonic() - t0 < 0.5 and not watchdog._thread.is_alive()
