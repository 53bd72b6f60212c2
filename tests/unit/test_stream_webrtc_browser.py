"""WebRTC delivery in headless Chromium against the fake model (`serve-stream --webrtc`), on loopback.

One browser streams a session over WebRTC (the page's first choice when the server offers it): frames arrive on the
<video> element, holding W lights the fake's W square and pans the picture from the first chunk computed under it,
a second browser on the full server (one session slot) is refused with the documented reason, and closing the first
page frees its session. A finite session over WebRTC is acknowledged lossless: every frame the server sent was
decoded. With TELEFUSER_ARTIFACTS set, a screenshot goes there.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.fake import ALLOWED_KEYS, FakeSessionFactory
from tests.unit.test_stream_latency_browser import assert_overhead_on_loopback
from tools.bench.stream_latency import browser

pytest.importorskip("aiortc", reason="aiortc is not installed (the --webrtc dependency)")
from telefuser.serving.stream.webrtc.settings import WebRtcSettings  # noqa: E402

WIDTH, HEIGHT = 320, 192
SCALE = HEIGHT // 48  # the fake's key squares: SCALE + i * 4 * SCALE from the left, 3 * SCALE wide, at the bottom
LIT, UNLIT = (255, 200, 0), (40, 40, 40)

# the mean colour of key square `index` in the <video>'s current frame
KEY_SQUARE = (
    """(index) => {
  const v = document.getElementById('video'); const c = document.createElement('canvas');
  c.width = v.videoWidth; c.height = v.videoHeight; const g = c.getContext('2d'); g.drawImage(v, 0, 0);
  const s = %d, size = 3 * s, x0 = s + index * (size + s), y0 = c.height - size - s;
  const d = g.getImageData(x0 + 2, y0 + 2, size - 4, size - 4).data; const sum = [0, 0, 0];
  for (let i = 0; i < d.length; i += 4) { sum[0] += d[i]; sum[1] += d[i + 1]; sum[2] += d[i + 2]; }
  return sum.map((v) => v / (d.length / 4)); }"""
    % SCALE
)


def _needs_browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if browser.chromium_missing():
        pytest.skip(browser.chromium_missing())
    return sync_api


def _near(colour, target, tolerance=40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(colour, target))


def _app(fake, **kw):
    kw.setdefault("max_sessions", 1)
    return create_stream_app(fake, delivery_mode="realtime", ack_timeout_s=3.0, webrtc=WebRtcSettings(), **kw)


def test_a_webrtc_session_streams_steers_refuses_a_second_browser_and_frees_on_close(tmp_path):
    sync_api = _needs_browser()
    fake = FakeSessionFactory(delay_s=0.1, defaults={"resolution": f"{WIDTH}x{HEIGHT}", "num_frames": None, "fps": 16})
    w = ALLOWED_KEYS.index("W")
    shot = tmp_path / "stream_webrtc.png"
    with serve_in_thread(_app(fake)) as base, sync_api.sync_playwright() as playwright:
        chromium = browser.launch(playwright)
        try:
            page = browser.open_page(chromium, base, transport="auto")
            browser.start_session(page)
            page.wait_for_function("window.tfStream.drawn >= 10", timeout=15_000)
            assert page.evaluate("window.tfStream.transport") == "webrtc"
            assert page.is_visible("#video") and not page.is_visible("#screen")
            before = page.evaluate(KEY_SQUARE, w)
            page.focus("#video")
            page.keyboard.down("w")
            page.wait_for_function("window.tfStream.summary().controls >= 1", timeout=15_000)
            page.wait_for_timeout(200)
            after = page.evaluate(KEY_SQUARE, w)
            page.screenshot(path=str(shot))
            page.keyboard.up("w")
            page.wait_for_function("window.tfStream.summary().controls >= 2", timeout=15_000)
            result = browser.summary(page)

            second = browser.open_page(chromium, base, transport="auto")
            second.click("#start")
            second.wait_for_function("window.tfStream.state === 'refused'", timeout=15_000)
            refusal = second.text_content("#refusal")

            session_id = page.evaluate("window.tfStream.sessionId")
            page.close()  # the viewer leaves: the peer connection closes with the page
            in_use = _wait_free(base)
            status = httpx.get(f"{base}/v1/stream/sessions/{session_id}", trust_env=False).json()
            errors = second.errors
        finally:
            chromium.close()
    assert errors == []
    assert _near(before, UNLIT) and _near(after, LIT), (before, after)
    (press, release) = result["latency_records"][:2]
    history = fake.sessions[0].history
    assert history[press["chunk"]]["keys"] == ["W"] and history[press["chunk"] - 1]["keys"] == []
    assert history[release["chunk"]]["keys"] == [] and history[release["chunk"] - 1]["keys"] == ["W"]
    assert result["bytes"] > 0 and result["displayed_fps"] > 0 and result["transport"] == "webrtc"
    # transport overhead: the chunks whose first frame the page presented, the track's pacing wait taken out
    print(f"\nWebRTC transport overhead: {result['overhead_records']}")
    assert result["overhead_chunks"] >= 3, result["overhead_records"]
    assert_overhead_on_loopback(result, chunk_interval_ms=1000 * 16 / 16)
    # negative control: the track held the first frames for their due time, and that wait is not in the overhead
    assert result["pacing_wait_p50_ms"] > result["overhead_p50_ms"], result["overhead_records"]
    assert refusal.startswith("429: all 1 session slot(s) are in use"), refusal
    assert in_use == 0 and status["close_reason"] == "disconnect" and fake.open_sessions == 0
    _keep(shot)


def test_a_finite_webrtc_session_is_acknowledged_lossless():
    sync_api = _needs_browser()
    frames = 13 + 16 * 3
    fake = FakeSessionFactory(
        delay_s=0.05, defaults={"resolution": f"{WIDTH}x{HEIGHT}", "num_frames": frames, "fps": 24}
    )
    with serve_in_thread(_app(fake)) as base, sync_api.sync_playwright() as playwright:
        chromium = browser.launch(playwright)
        try:
            page = browser.open_page(chromium, base, transport="auto")
            browser.start_session(page, num_frames=frames)
            page.wait_for_function("document.getElementById('delivery').dataset.match !== ''", timeout=20_000)
            delivery = page.text_content("#delivery")
            ack = page.evaluate("window.tfStream.ack")
            errors = page.errors
        finally:
            chromium.close()
    assert errors == []
    assert ack["match"] is True and ack["published_frames"] == ack["acked_frames"] == frames, ack
    assert delivery == f"{frames}/{frames} frames ✓ lossless"


def _wait_free(base: str, timeout_s: float = 15) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        in_use = httpx.get(f"{base}/v1/service/health", trust_env=False).json()["sessions_in_use"]
        if in_use == 0 or time.monotonic() > deadline:
            return in_use
        time.sleep(0.1)


def _keep(shot: Path) -> None:
    assert shot.stat().st_size > 5_000
    artifacts = os.environ.get("TELEFUSER_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / shot.name)


def test_the_page_falls_back_to_the_websocket_when_the_offer_is_refused():
    sync_api = _needs_browser()
    frames = 13 + 16
    fake = FakeSessionFactory(
        delay_s=0.02, defaults={"resolution": f"{WIDTH}x{HEIGHT}", "num_frames": frames, "fps": 32}
    )
    with serve_in_thread(_app(fake)) as base, sync_api.sync_playwright() as playwright:
        chromium = browser.launch(playwright)
        try:
            page = browser.open_page(chromium, base, transport="auto")
            body = '{"detail": "no WebRTC here (a proxy that does not pass it)"}'
            page.route(
                "**/webrtc*", lambda route: route.fulfill(status=502, body=body, content_type="application/json")
            )
            browser.start_session(page, num_frames=frames)
            page.wait_for_function("window.tfStream.ack !== null", timeout=15_000)
            transport, ack, log = (
                page.evaluate("window.tfStream.transport"),
                page.evaluate("window.tfStream.ack"),
                page.text_content("#log"),
            )
            errors = page.errors
        finally:
            chromium.close()
    assert errors == [] and transport == "websocket" and ack["match"] is True
    assert "WebRTC failed (offer refused, 502: no WebRTC here" in log and "falling back to the WebSocket" in log
