"""The handshake watchdog with stand-in events (CPU): its clock starts when the copy stream reaches the handshake,
it never holds its lock while it queries, and it reports its own failures instead of dying silently."""

from __future__ import annotations

import threading
import time

from telefuser.distributed.ulysses.watchdog import HandshakeWatchdog


class FakeEvent:
    """An event that completes when the test says so; `query()` may also block or raise."""

    def __init__(self, done: bool = False, block_s: float = 0.0, error: Exception | None = None):
        self.done, self.block_s, self.error = done, block_s, error
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        if self.error is not None:
            raise self.error
        if self.block_s:
            time.sleep(self.block_s)
        return self.done


def _watchdog(timeout_s: float):
    fired: list[str] = []
    return HandshakeWatchdog(0, timeout_s, on_timeout=fired.append, poll_s=0.005), fired


def test_a_backlog_before_the_handshake_does_not_count():
    watchdog, fired = _watchdog(0.2)
    reached, done = FakeEvent(), FakeEvent()
    watchdog.watch(7, reached, done)
    time.sleep(0.6)  # the GPU is busy with earlier work three timeouts long: not a dead peer
    reached.done = True
    time.sleep(0.05)
    done.done = True
    time.sleep(0.05)
    watchdog.close()
    assert fired == []


def test_a_stalled_handshake_fires_about_one_timeout_after_it_was_reached():
    watchdog, fired = _watchdog(0.2)
    reached, done = FakeEvent(), FakeEvent()
    watchdog.watch(3, reached, done)
    time.sleep(0.3)
    assert fired == []
    reached.done = True
    t0 = time.monotonic()
    while not fired and time.monotonic() - t0 < 3:
        time.sleep(0.01)
    watchdog.close()
    assert fired and "handshake epoch 3 did not complete within 0.2s of the copy stream reaching it" in fired[0]
    assert 0.18 <= time.monotonic() - t0 < 1.5


def test_watch_never_waits_for_a_slow_query():
    watchdog, _ = _watchdog(30.0)
    watchdog.watch(1, FakeEvent(done=True), FakeEvent(block_s=0.5))  # the thread is inside a 0.5 s query now
    time.sleep(0.05)
    t0 = time.monotonic()
    watchdog.watch(2, FakeEvent(), FakeEvent())
    assert time.monotonic() - t0 < 0.1  # the submitting thread does not wait behind the GPU query
    watchdog.close()


def test_a_failing_query_is_reported_not_swallowed(capsys):
    watchdog, fired = _watchdog(30.0)
    watchdog.watch(5, FakeEvent(done=True), FakeEvent(error=RuntimeError("CUDA error: an illegal memory access")))
    t0 = time.monotonic()
    while watchdog.error is None and time.monotonic() - t0 < 3:
        time.sleep(0.01)
    watchdog.close()
    assert watchdog.error == "RuntimeError: CUDA error: an illegal memory access"
    assert "the Ulysses handshake watchdog failed" in capsys.readouterr().err
    assert fired == []


def test_completed_groups_are_retired_in_order():
    watchdog, fired = _watchdog(0.2)
    events = [(FakeEvent(done=True), FakeEvent(done=True)) for _ in range(50)]
    for epoch, (reached, done) in enumerate(events, 1):
        watchdog.watch(epoch, reached, done)
    time.sleep(0.2)
    with watchdog._lock:
        left = len(watchdog._pending)
    watchdog.close()
    assert left == 0 and fired == [] and threading.active_count() >= 1


def _wait_fired(fired: list[str], within_s: float = 3.0) -> None:
    t0 = time.monotonic()
    while not fired and time.monotonic() - t0 < within_s:
        time.sleep(0.01)


def test_a_group_added_while_another_is_pending_is_still_watched():
    watchdog, fired = _watchdog(0.2)
    first, second = (FakeEvent(done=True), FakeEvent()), (FakeEvent(), FakeEvent())
    watchdog.watch(1, *first)
    time.sleep(0.05)
    watchdog.watch(2, *second)
    first[1].done = True  # group 1 completes; group 2 reaches its handshake and stalls
    second[0].done = True
    _wait_fired(fired)
    watchdog.close()
    assert len(fired) == 1 and "handshake epoch 2 did not complete" in fired[0]


def test_a_group_after_the_queue_drained_wakes_the_idle_thread():
    watchdog, fired = _watchdog(0.2)
    watchdog.watch(1, FakeEvent(done=True), FakeEvent(done=True))
    time.sleep(0.1)  # retired: the thread now sleeps without a deadline
    with watchdog._lock:
        assert not watchdog._pending
    watchdog.watch(2, FakeEvent(done=True), FakeEvent())
    _wait_fired(fired)
    watchdog.close()
    assert len(fired) == 1 and "handshake epoch 2 did not complete" in fired[0]
