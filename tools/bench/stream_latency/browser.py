"""The stream page in headless Chromium (Debian's, driven by playwright): open it, start a session, press keys the way
a viewer does, read what the page measured (static/measure.js). Shared by the browser tests and the bench."""

from __future__ import annotations

import os
import random
import time
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--autoplay-policy=no-user-gesture-required",
    # keep a hidden or occluded page's timers and video running (a benchmark page is never in front)
    "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]  # fmt: skip


def chromium_missing(path: str = CHROMIUM) -> str | None:
    """The reason the browser cannot run here, or None."""
    return None if os.path.exists(path) else f"chromium not installed: {path} does not exist (apt-get install chromium)"


def launch(playwright, path: str = CHROMIUM):
    return playwright.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)


def open_page(browser, base: str, *, transport: str = "auto", api_key: str | None = None, timeout_s: float = 20):
    """The page at `base`, metadata loaded; `transport` "auto" (WebRTC when offered) or "websocket". Page errors are
    collected in `page.errors`."""
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.goto(base + "/" + (f"#api_key={api_key}" if api_key else ""))
    page.wait_for_function("document.querySelector('#resolution').options.length > 0", timeout=timeout_s * 1000)
    page.select_option("#transport", transport)
    return page


def start_session(
    page,
    *,
    num_frames: int | None = None,
    resolution: str | None = None,
    fps: float | None = None,
    timeout_s: float = 60,
) -> None:
    """Press Start (num_frames None: an open-ended session) and wait for the first frame on screen."""
    page.fill("#num-frames", "" if num_frames is None else str(num_frames))
    if resolution:  # one the model does not list is offered anyway: the server decides
        page.evaluate(
            """(r) => { const s = document.getElementById('resolution');
               if (![...s.options].some((o) => o.value === r)) s.add(new Option(r, r)); }""",
            resolution,
        )
        page.select_option("#resolution", resolution)
    if fps:
        page.fill("#fps", str(fps))
    page.click("#start")
    page.wait_for_function(
        "window.tfStream.drawn >= 1 || ['refused', 'error'].includes(window.tfStream.state)", timeout=timeout_s * 1000
    )
    if page.evaluate("window.tfStream.state") in ("refused", "error"):
        raise RuntimeError(f"the session did not start: {page.text_content('#refusal') or page.text_content('#log')}")


def controls_shown(page) -> int:
    return page.evaluate("window.tfStream.summary().controls")


def press_keys(
    page, presses: int, *, key: str = "w", hold_s: float = 0.5, spread_s: float = 1.0, timeout_s: float = 30, seed=0
) -> None:
    """Hold `key` `presses` times; each press and each release is one control, and the next waits until the page has
    shown the previous one. A random pause of up to `spread_s` (about one chunk interval) before each press and
    release spreads them over the chunk's phase, as a person's would be."""
    rng = random.Random(seed)
    page.focus("#screen" if page.is_visible("#screen") else "#video")
    expected = controls_shown(page)
    for _ in range(presses):
        for press in (page.keyboard.down, page.keyboard.up):
            time.sleep(rng.uniform(0, spread_s))
            press(key)
            expected += 1
            page.wait_for_function(f"window.tfStream.summary().controls >= {expected}", timeout=timeout_s * 1000)
            time.sleep(hold_s if press is page.keyboard.down else 0)


def summary(page) -> dict[str, Any]:
    return page.evaluate("window.tfStream.summary()")
