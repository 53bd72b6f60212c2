"""The web client in headless Chromium (Debian's, driven by playwright) against the fake model.

The service requires an API key: the page first says so, then takes the key from its field (HTTP calls send it as
a bearer header, the WebSocket opens with the session's stream token). It starts a session from the page, waits
for frames on the canvas, holds W and checks that the page shows the server's acknowledgement and that the model
received the key from the acknowledged chunk on, plays to the end and checks the delivery ack. A screenshot goes to
the test's tmp dir and, when TELEFUSER_ARTIFACTS is set, there too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from telefuser.serving.common.auth import ApiKeys
from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.fake import FakeSessionFactory

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip
NUM_FRAMES = 13 + 16 * 5  # 6 chunks
API_KEY = "browser-test-key"


def _launch(playwright):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"chromium not installed: {CHROMIUM} does not exist (apt-get install chromium)")
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def test_page_streams_plays_and_acknowledges_controls(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    # About real time (16 frames per 0.5 s against 24 FPS playback), so the key press lands while chunks are still
    # being generated, as with the real model.
    fake = FakeSessionFactory(delay_s=0.5, defaults={"resolution": "320x192", "num_frames": NUM_FRAMES, "fps": 24})
    app = create_stream_app(fake, max_sessions=1, ack_timeout_s=5.0, api_keys=ApiKeys([API_KEY]))
    shot = tmp_path / "stream_page.png"
    with serve_in_thread(app) as base, sync_api.sync_playwright() as playwright:
        browser = _launch(playwright)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 760})
            page_errors: list[str] = []
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.goto(base + "/")
            page.wait_for_function("document.getElementById('model-info').dataset.auth === 'required'")
            page.fill("#api-key", API_KEY)
            page.dispatch_event("#api-key", "change")
            page.wait_for_function("document.querySelector('#resolution').options.length > 0")
            assert page.get_attribute("#model-info", "data-auth") == "accepted"
            assert page.input_value("#resolution") == "320x192" and page.input_value("#num-frames") == str(NUM_FRAMES)
            page.click("#start")
            page.wait_for_function("window.tfStream.drawn >= 5", timeout=20_000)
            drawn_before = page.evaluate("window.tfStream.drawn")
            # Frames are really on the canvas: many distinct colours, not a blank or flat image.
            colours = page.evaluate(
                """() => { const c = document.getElementById('screen');
                   const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; const seen = new Set();
                   for (let i = 0; i < d.length; i += 4 * 7) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
                   return seen.size; }"""
            )
            assert colours > 50, colours
            page.focus("#screen")
            page.keyboard.down("w")
            page.wait_for_function("document.getElementById('control-ack').dataset.keys === 'W'", timeout=10_000)
            applies_from = int(page.get_attribute("#control-ack", "data-applies-from"))
            assert page.text_content("#control-ack") == f"W from chunk {applies_from}"
            page.wait_for_function(f"window.tfStream.drawn > {drawn_before}")  # the frame counter advances
            # Keys are held state: keep W down until the acknowledged chunk has been generated with it.
            page.wait_for_function(f"window.tfStream.chunks > {applies_from}", timeout=10_000)
            page.wait_for_timeout(300)
            page.screenshot(path=str(shot))
            page.keyboard.up("w")
            page.wait_for_function("document.getElementById('delivery').dataset.match === 'true'", timeout=20_000)
            page.wait_for_function("window.tfStream.state === 'finished'", timeout=20_000)
            stats = page.evaluate("({drawn: window.tfStream.drawn, received: window.tfStream.received})")
            delivery = page.text_content("#delivery")
        finally:
            browser.close()
    assert page_errors == []
    assert stats == {"drawn": NUM_FRAMES, "received": NUM_FRAMES}  # every frame delivered and played
    assert delivery == f"{NUM_FRAMES}/{NUM_FRAMES} frames ✓ lossless"
    history = fake.sessions[0].history
    assert 0 <= applies_from < len(history)
    assert all("W" not in h["keys"] for h in history[:applies_from]) and "W" in history[applies_from]["keys"]
    assert shot.stat().st_size > 10_000
    artifacts = os.environ.get("TELEFUSER_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / shot.name)
