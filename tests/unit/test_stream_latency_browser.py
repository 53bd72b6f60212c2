"""Control-to-display in a real browser: the page (headless Chromium) against the fake model in realtime delivery.

Each control the page sends carries its own seq, each chunk the control it was computed under; the page records when
the first frame computed under a control is drawn. The test presses and releases W a few times and checks what the
page measured against what the model received: every control is timed, each at the first chunk computed under it,
and the page never held more than the buffer the session announced. The numbers (p50/p95 latency, chunk interval,
displayed FPS) are printed and, with TELEFUSER_ARTIFACTS set, written there; targets are the bench's
(tools/bench/stream_latency), not this test's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.fake import FakeSessionFactory
from tools.bench.stream_latency import browser

FPS, CHUNK = 16, 16
PRESSES = 3


def test_the_page_times_each_control_to_its_first_frame_on_screen():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if browser.chromium_missing():
        pytest.skip(browser.chromium_missing())
    fake = FakeSessionFactory(delay_s=0.1, defaults={"resolution": "320x192", "num_frames": None, "fps": FPS})
    app = create_stream_app(fake, max_sessions=1, delivery_mode="realtime", buffer_chunks=2, ack_timeout_s=2.0)
    with serve_in_thread(app) as base, sync_api.sync_playwright() as playwright:
        chromium = browser.launch(playwright)
        try:
            page = browser.open_page(chromium, base, transport="websocket")
            browser.start_session(page)
            browser.press_keys(page, PRESSES, hold_s=0.3, spread_s=1.0, timeout_s=15)
            result = browser.summary(page)
            page.click("#end")
            page.wait_for_function("window.tfStream.state !== 'playing'", timeout=10_000)
            errors = page.errors
        finally:
            chromium.close()
    _report(result)
    assert errors == []
    assert result["transport"] == "websocket" and result["pending_controls"] == 0
    assert result["controls"] == 2 * PRESSES
    history = fake.sessions[0].history
    pressed = ["W"]
    for i, record in enumerate(result["latency_records"]):
        keys = pressed if i % 2 == 0 else []  # press, release, press, ...
        chunk = record["chunk"]
        # the first frame drawn under the control is the first chunk the model computed with it
        assert history[chunk]["keys"] == keys and history[chunk - 1]["keys"] != keys, (i, record, history[:chunk])
        # bounded by construction: one chunk interval until the next chunk starts, then at most the buffer on screen
        assert 0 < record["ms"] < 1000 * (CHUNK + result["buffer_frames"]) / FPS + 1500, record
    assert result["held_max_frames"] <= result["buffer_frames"] == 2 * CHUNK
    assert result["chunk_interval_mean_ms"] > 0 and result["displayed_fps"] > 0
    # the transport overhead (server's computed_at -> first frame decoded and drawable) of every chunk the page decoded
    overhead = [r["ms"] for r in result["overhead_records"]]
    assert result["overhead_chunks"] == len(overhead) >= result["chunks"] - 1 >= 4, result["overhead_records"]
    assert_overhead_on_loopback(result, chunk_interval_ms=1000 * CHUNK / FPS)
    assert result["pacing_wait_p95_ms"] == 0  # no pacing on the WebSocket: the page's playout is not counted


def assert_overhead_on_loopback(result: dict, chunk_interval_ms: float) -> None:
    """Every chunk's transport overhead is positive (the server stamps before encoding, the page after decoding, on
    one host's clock) and below one chunk interval: playout buffering (realtime mode holds about 0.3 s of frames when
    a chunk lands, more on a slow machine) or WebRTC pacing leaking in would show as up to a chunk interval or more,
    while encode + send + decode of one chunk at 320x192 on loopback takes tens of ms."""
    assert abs(result["clock_offset_ms"]) < 50, result["clock_offset_ms"]  # the page's clock is the wall clock
    overhead = [r["ms"] for r in result["overhead_records"]]
    assert overhead and all(ms > 0 for ms in overhead), result["overhead_records"]
    assert 0 < result["overhead_p50_ms"] <= result["overhead_p95_ms"] < chunk_interval_ms, result["overhead_records"]


def _report(result: dict, name: str = "stream_latency_browser") -> None:
    print(
        f"\ncontrol-to-display over the WebSocket, {result.get('model', 'fake')} model, realtime: "
        f"p50 {result['latency_p50_ms']:.0f} ms, p95 {result['latency_p95_ms']:.0f} ms over {result['controls']} "
        f"controls; chunk interval {result['chunk_interval_mean_ms']:.0f} ms; displayed {result['displayed_fps']:.1f} "
        f"FPS; held at most {result['held_max_frames']} of {result['buffer_frames']} frames; transport overhead "
        f"p50 {result['overhead_p50_ms']:.0f} ms, p95 {result['overhead_p95_ms']:.0f} ms over "
        f"{result['overhead_chunks']} chunks"
    )
    artifacts = os.environ.get("TELEFUSER_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        (Path(artifacts) / f"{name}.json").write_text(json.dumps(result, indent=2))


def test_the_page_says_when_the_model_is_slower_than_real_time():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if browser.chromium_missing():
        pytest.skip(browser.chromium_missing())
    # 16 frames a second of compute against 24 FPS playback
    fake = FakeSessionFactory(delay_s=1.0, defaults={"resolution": "320x192", "num_frames": 13 + 16 * 3, "fps": 24})
    app = create_stream_app(fake, max_sessions=1, delivery_mode="realtime", ack_timeout_s=2.0)
    with serve_in_thread(app) as base, sync_api.sync_playwright() as playwright:
        chromium = browser.launch(playwright)
        try:
            page = browser.open_page(chromium, base, transport="websocket")
            browser.start_session(page, num_frames=13 + 16 * 3)
            page.wait_for_selector("#slow-warning", state="visible", timeout=15_000)
            warning = page.text_content("#slow-warning")
            generation_fps = float(page.text_content("#stat-gen-fps"))
            buffer_max = page.text_content("#stat-buffer-max")
            page.wait_for_function("window.tfStream.state === 'finished'", timeout=20_000)
            result = browser.summary(page)
            errors = page.errors
        finally:
            chromium.close()
    assert errors == []
    assert "slower than the 24 FPS playback" in warning and 10 < generation_fps < 20, (warning, generation_fps)
    assert buffer_max == "64 frames (4 chunks)"
    assert result["stalls"] >= 1 and result["held_max_frames"] <= result["buffer_frames"]


def test_the_bench_measures_the_tiny_lingbot_model_in_the_browser(tmp_path):
    """tools/bench/stream_latency end to end: serve-stream --config tiny on the CPU (64x48, realtime), the page in
    Chromium, two presses; the bench's JSON has every control timed and the page within its buffer."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if browser.chromium_missing():
        pytest.skip(browser.chromium_missing())
    from tools.bench.stream_latency.cli import main

    output = tmp_path / "latency.json"
    args = ["--config", "tiny", "--device", "cpu", "--threads", "1", "--resolution", "64x48", "--presses", "2"]
    args += ["--warmup-s", "1", "--control-timeout", "60", "--startup-timeout", "120", "--output", str(output)]
    args += ["--service-log", str(tmp_path / "service.log")]
    assert main(args) == 0, (tmp_path / "service.log").read_text()[-3000:]
    (result,) = json.loads(output.read_text())
    assert result["model"] == "LingBot-World v2" and result["transport"] == "websocket"
    assert result["controls"] == 4 and result["pending_controls"] == 0 and result["page_errors"] == []
    assert result["held_max_frames"] <= result["buffer_frames"] and result["generation_fps"] > 0
    _report(result, "stream_latency_tiny")
