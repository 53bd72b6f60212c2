"""The transport overhead (PROTOCOL.md, "Measuring the transport overhead"): the server's `computed_at` stamp, the
WebRTC track's pacing wait, and the client side arithmetic and table column. The negative controls show that what
the measure leaves out on purpose (frames waiting in the viewer's playout buffer, frames waiting for their due time
on the paced track) is large where it happens, and still stays out of the overhead."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from telefuser.pipelines.chunk import Chunk
from telefuser.serving.stream.envelope import unpack
from telefuser.serving.stream.events import next_chunk_stamped, prepare_chunk
from tools.bench.stream_latency.measure import Measure, overhead_ms
from tools.bench.stream_latency.playout import PagePlayout
from tools.bench.stream_latency.table import COLUMNS, row


def test_the_overhead_is_displayable_minus_computed_minus_pacing_once_per_stamped_chunk():
    assert overhead_ms(1_000.0, 1_050.0) == 50.0
    assert overhead_ms(1_000.0, 1_450.0, paced_ms=400.0) == 50.0  # the track's wait for the due time is not transport
    m = Measure()
    for chunk, ms in enumerate([30, 10, 20, 40, 90]):
        m.transported(chunk, 5_000.0, 5_000.0 + ms)
    m.transported(0, 5_000.0, 9_999.0)  # the same chunk again (a later frame of it): not counted twice
    m.transported(5, None, 9_999.0)  # a server that does not stamp: nothing to measure
    s = m.summary()
    assert s["overhead_chunks"] == 5 and [r["ms"] for r in s["overhead_records"]] == [30, 10, 20, 40, 90]
    assert (s["overhead_p50_ms"], s["overhead_p95_ms"]) == (30, 90)  # sorted[ceil(q n) - 1]: 10 20 [30] 40 [90]
    assert (s["pacing_wait_p50_ms"], s["pacing_wait_p95_ms"]) == (0, 0)
    cells = dict(zip(COLUMNS, row({**s, "transport": "websocket"})))
    assert cells["transport p50/p95 ms"] == "30 / 90"
    # negative control: a summary without the measure (an older server, or no chunk yet) prints n/a, never 0
    assert dict(zip(COLUMNS, row(Measure().summary())))["transport p50/p95 ms"] == "n/a / n/a"


def test_frames_held_in_the_playout_buffer_do_not_count_as_transport():
    """The Python client's page (lossless: playback waits for two chunks). Chunk 0 arrives at once and waits about
    0.6 s for chunk 1 before it is drawn; its overhead ends when it was decoded, not when playout reached it."""

    async def main():
        measure = Measure()

        async def send(_message):
            return None

        playout = PagePlayout(measure, send, decode=False)
        playout.configure({"fps": 16, "delivery_mode": "lossless", "buffer_chunks": 4})
        playout.start()
        frames = np.zeros((4, 16, 16, 3), np.uint8)
        stamped_at = []
        try:
            for index in range(2):
                item = prepare_chunk(Chunk(index, frames, {}), index, 4 * index, "jpeg", 85, 0.0)
                item.computed_at = time.time() * 1000
                stamped_at.append(time.perf_counter())
                playout.envelope(item.envelope(16.0))
                await asyncio.sleep(0.6)
        finally:
            await playout.stop()
        return measure, stamped_at

    measure, stamped_at = asyncio.run(main())
    s = measure.summary()
    drawn_after_s = measure.first_draw - stamped_at[0]  # chunk 0's first frame on screen, after its stamp
    assert s["overhead_chunks"] == 2 and s["frames_drawn"] >= 4
    assert drawn_after_s > 0.55  # negative control: chunk 0 did wait in the buffer...
    assert 0 < s["overhead_records"][0]["ms"] < 100, s["overhead_records"]  # ...and that wait is not transport
    assert 0 < s["overhead_p95_ms"] < 100


def test_the_server_stamps_computed_at_after_the_model_and_before_encoding():
    class Model:
        def next_chunk(self, keys):
            time.sleep(0.05)
            return Chunk(0, np.zeros((2, 16, 16, 3), np.uint8), {})

    before = time.time() * 1000
    chunk, computed_at = next_chunk_stamped(Model(), [])
    item = prepare_chunk(chunk, 0, 0, "jpeg", 85, 0.05)
    assert before + 50 <= computed_at <= time.time() * 1000  # after the model's compute
    header, _ = unpack(item.envelope(16.0))
    assert "computed_at" not in header  # not stamped: the envelope is the one older clients know
    item.computed_at = computed_at
    header, _ = unpack(item.envelope(16.0))
    assert header["computed_at"] == round(computed_at, 3) and header["control_seq"] is None


def test_the_track_reports_the_wait_for_the_due_time_of_each_chunks_first_frame():
    pytest.importorskip("aiortc", reason="aiortc is not installed (the --webrtc dependency)")
    from telefuser.serving.stream.webrtc.track import PacedVideoTrack

    def packet():
        return SimpleNamespace(size=100, pts=None, time_base=None)

    async def main():
        starts = []
        track = PacedVideoTrack(10, on_sent=lambda *_: None, on_chunk_start=starts.append)
        # chunk 0 (two frames) and chunk 1's first frame queued at once: chunk 1 waits two intervals (0.2 s)
        track.push(packet(), {"chunk": 0})
        track.push(packet(), None)
        track.push(packet(), {"chunk": 1})
        for _ in range(3):
            await track.recv()
        await asyncio.sleep(0.3)  # the queue ran dry: chunk 2 goes out as it comes, with no wait for pacing
        track.push(packet(), {"chunk": 2})
        await track.recv()
        track.stop()
        return starts

    starts = asyncio.run(main())
    paced = {s["chunk"]: s["paced_ms"] for s in starts}
    assert paced[0] == 0 and paced[2] == 0, paced
    assert 180 <= paced[1] <= 220, paced  # negative control: the wait is there, and the page subtracts it


def test_the_python_client_reports_the_websocket_overhead_on_loopback():
    """tools/bench/stream_latency/client.py against the fake model (realtime, 320x192 at 16 FPS, one press): every
    decoded chunk has its overhead, positive and below one chunk interval (1 s), as in the browser test."""
    from telefuser.serving.common.local_server import serve_in_thread
    from telefuser.serving.stream.app import create_stream_app
    from telefuser.serving.stream.fake import FakeSessionFactory
    from tools.bench.stream_latency.client import LatencyClient, parse_args

    fake = FakeSessionFactory(delay_s=0.1, defaults={"resolution": "320x192", "num_frames": None, "fps": 16})
    app = create_stream_app(fake, max_sessions=1, delivery_mode="realtime", buffer_chunks=2, ack_timeout_s=2.0)
    with serve_in_thread(app) as base:
        args = parse_args(["--url", base, "--presses", "1", "--warmup-s", "0.5", "--hold-s", "0.2", "--spread-s", "0"])
        s = asyncio.run(asyncio.wait_for(LatencyClient(args, base).run(), 60))
    assert s["errors"] == [] and s["controls"] == 2 and s["ack"]["match"] is True
    assert s["overhead_chunks"] >= s["chunks"] - 1 >= 2, s["overhead_records"]
    assert all(r["ms"] > 0 for r in s["overhead_records"]), s["overhead_records"]
    assert 0 < s["overhead_p50_ms"] <= s["overhead_p95_ms"] < 1000, s["overhead_records"]
    assert dict(zip(COLUMNS, row(s)))["transport p50/p95 ms"] != "n/a / n/a"
