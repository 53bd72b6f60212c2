"""Bounded playout (playout.py): the generator never runs more than the announced buffer ahead of what the viewer has
played, starts a realtime chunk just in time, and reads the held keys when the chunk starts. Driven at the session
level with a simulated viewer that plays at the session's FPS and reports like the page does."""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from telefuser.serving.stream.fake import FakeSessionFactory
from telefuser.serving.stream.metrics import StreamMetrics
from telefuser.serving.stream.playout import LEAD_MARGIN_S, PlayoutGate
from telefuser.serving.stream.events import ChunkItem, DoneItem
from telefuser.serving.stream.session import StreamSessionState
from telefuser.serving.stream.settings import StreamSettings

FPS, CHUNK, BUFFER_CHUNKS = 64, 16, 3  # a fast clock keeps the test short; the rules do not depend on it


# ---- the gate alone ---------------------------------------------------------------------------------------------------
def test_a_reporting_viewer_bounds_the_lead_in_both_modes():
    for realtime in (False, True):
        gate = PlayoutGate(fps=16, buffer_frames=2 * CHUNK, realtime=realtime)
        gate.on_generated(13, 0.1)
        gate.on_sent(13)
        gate.on_played(0, 13)
        assert gate.outstanding == 13 and gate.may_start(CHUNK) is (not realtime)  # realtime: not yet due
        gate.on_generated(CHUNK, 0.1)
        assert not gate.may_start(CHUNK)  # 29 + 16 > 32: the viewer would hold more than the buffer
        gate.on_sent(CHUNK)
        gate.on_played(13, CHUNK)
        assert gate.may_start(CHUNK) is (not realtime)  # 16 outstanding: a chunk fits; realtime waits for the lead
        gate.on_played(13 + CHUNK - gate.lead_frames() if realtime else 13, 0)
        assert gate.may_start(CHUNK)  # realtime: the viewer is within one compute + margin of running dry


def test_lossless_without_reports_leaves_the_fifo_in_charge_and_realtime_counts_sends():
    lossless = PlayoutGate(fps=16, buffer_frames=CHUNK, realtime=False)
    lossless.on_generated(10 * CHUNK, 0.1)
    assert lossless.may_start(CHUNK)  # backpressure is the FIFO's (lossless mode keeps its behaviour)
    realtime = PlayoutGate(fps=16, buffer_frames=CHUNK, realtime=True)
    realtime.on_generated(CHUNK, 0.1)
    assert not realtime.may_start(CHUNK)
    realtime.on_sent(CHUNK)
    assert realtime.may_start(CHUNK)


def test_a_report_never_counts_more_than_was_sent():
    gate = PlayoutGate(fps=16, buffer_frames=CHUNK, realtime=True)
    gate.on_generated(CHUNK, 0.1)
    gate.on_played(10**9, 0)  # a hostile or confused client
    assert gate.played == 0 and gate.outstanding == CHUNK and not gate.may_start(CHUNK)


def test_the_webrtc_track_may_send_a_chunk_before_the_chunk_counts_as_sent():
    # it takes each frame as it is encoded; clamping its count to the sent chunks would leave the generator waiting
    gate = PlayoutGate(fps=16, buffer_frames=2 * CHUNK, realtime=True)
    gate.expect_reports()
    gate.on_generated(CHUNK, 0.1)
    gate.on_track_sent(CHUNK, 0)
    assert gate.played == CHUNK and gate.outstanding == 0 and gate.may_start(CHUNK)
    gate.on_track_sent(10 * CHUNK, 0)
    assert gate.played == CHUNK  # never more than was generated


def test_the_just_in_time_lead_is_one_compute_plus_the_margin():
    gate = PlayoutGate(fps=16, buffer_frames=8 * CHUNK, realtime=True)
    gate.on_generated(CHUNK, 0.5)
    gate.on_sent(CHUNK)
    gate.on_played(0, CHUNK)
    lead = math.ceil((0.5 + LEAD_MARGIN_S) * 16)
    assert gate.lead_frames() == lead and not gate.may_start(CHUNK)
    gate.on_played(CHUNK - lead, lead)
    assert gate.may_start(CHUNK)


# ---- a session with a simulated viewer --------------------------------------------------------------------------------
class Viewer:
    """Plays the session's frames at FPS and reports every other frame, as the page does (about every 100 ms)."""

    def __init__(self, runtime: StreamSessionState):
        self.runtime = runtime
        self.buffer = 0
        self.played = 0
        self.held_max = 0
        self.done = False

    async def consume(self) -> None:
        async for item in self.runtime.events():
            if isinstance(item, ChunkItem):
                self.runtime.mark_sent(item, 0)
                self.buffer += item.frames
                self.held_max = max(self.held_max, self.buffer)
            elif isinstance(item, DoneItem):
                self.runtime.done_payload(item)
                self.done = True
                return

    async def play(self) -> None:
        self.runtime.record_playout(0, 0)
        while not (self.done and self.buffer == 0):
            await asyncio.sleep(1 / FPS)
            if self.buffer:
                self.buffer -= 1
                self.played += 1
                if self.played % 2 == 0 or self.buffer == 0:
                    self.runtime.record_playout(self.played, self.buffer)


def _session(mode: str, *, chunks: int, delay_s: float):
    fake = FakeSessionFactory(delay_s=delay_s)
    config = {**fake.defaults, "resolution": "32x32", "num_frames": 13 + CHUNK * (chunks - 1), "fps": FPS}
    model = fake.create(np.zeros((8, 8, 3), np.uint8), "p", config)
    pool = ThreadPoolExecutor(2)
    loop = asyncio.get_running_loop()
    runtime = StreamSessionState(
        "s",
        model,
        prompt="p",
        config=config,
        codec="raw",
        settings=StreamSettings(delivery_mode=mode, buffer_chunks=BUFFER_CHUNKS),
        metrics=StreamMetrics(),
        run_blocking=lambda fn, *a: loop.run_in_executor(pool, fn, *a),
        on_released=lambda r: None,
        on_closed=lambda r: None,
        chunk_frames=CHUNK,
    )
    starts: list[dict] = []  # what the gate saw when each chunk started
    next_chunk = model.next_chunk

    def recording_next_chunk(keys):
        gate = runtime.playout
        starts.append({"outstanding": gate.outstanding, "lead": gate.lead_frames(), "t": time.monotonic()})
        return next_chunk(keys)

    model.next_chunk = recording_next_chunk
    return runtime, model, starts, pool


@pytest.mark.parametrize("mode", ["realtime", "lossless"])
def test_the_viewer_never_holds_more_than_the_announced_buffer(mode):
    async def main():
        runtime, model, starts, pool = _session(mode, chunks=8, delay_s=0.02)
        viewer = Viewer(runtime)
        runtime.attach("test", images=True)
        await asyncio.wait_for(asyncio.gather(viewer.consume(), viewer.play()), timeout=20)
        await runtime.aclose("completed")
        pool.shutdown()
        return runtime, model, starts, viewer

    runtime, model, starts, viewer = asyncio.run(main())
    buffer_frames = BUFFER_CHUNKS * CHUNK
    assert len(starts) == 8 and viewer.played == 13 + 7 * CHUNK and runtime.frames_dropped == 0
    assert viewer.held_max <= buffer_frames, viewer.held_max
    assert all(s["outstanding"] + CHUNK <= buffer_frames for s in starts[1:]), starts
    if mode == "realtime":  # just in time: each later chunk started once the viewer was within one compute + margin
        assert all(s["lead"] is not None and s["outstanding"] <= s["lead"] < buffer_frames for s in starts[2:]), starts
        assert runtime.playout.waited_s > 0.3 and runtime.metrics.value("playout_wait_seconds_total") > 0.3
    else:  # lossless: only the buffer bounds it, so the viewer's buffer fills up to it
        assert viewer.held_max > 2 * CHUNK, viewer.held_max


def test_a_control_that_arrives_mid_chunk_applies_to_the_next_chunk():
    async def main():
        runtime, model, starts, pool = _session("realtime", chunks=6, delay_s=0.15)
        viewer = Viewer(runtime)
        runtime.attach("test", images=True)
        play = asyncio.gather(viewer.consume(), viewer.play())
        while len(starts) < 3:  # chunk 2 is computing
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        state = runtime.set_controls(["W"], seq=11)
        await asyncio.wait_for(play, timeout=20)
        await runtime.aclose("completed")
        pool.shutdown()
        return state, model

    state, model = asyncio.run(main())
    assert state["applies_from_chunk"] == 3 and state == {**state, "generation": 1, "seq": 11}
    assert [h["keys"] for h in model.history] == [[]] * 3 + [["W"]] * 3
