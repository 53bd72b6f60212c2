"""`python -m tools.bench.stream_latency`: control-to-display latency in headless Chromium, per transport.

    python -m tools.bench.stream_latency --fake                         # WebSocket, the fake model at 16 FPS
    python -m tools.bench.stream_latency --fake --transports websocket,webrtc   # side by side (serve-stream --webrtc)
    python -m tools.bench.stream_latency --config tiny --device cpu --resolution 128x96
    python -m tools.bench.stream_latency --url http://127.0.0.1:8088    # a service that is running

Per transport: open the page, start a session (--num-frames), let it play `--warmup-s`, then press and release W
`--presses` times (each control waits until the page has shown the one before, after a random pause of up to one
chunk interval), then end the session. The page's own measurements (static/measure.js) make the row: control-to-
display p50/p95 (send of the control -> the first frame computed under it drawn), the transport overhead p50/p95
(per chunk: the server's `computed_at` -> its first frame drawable, less the WebRTC track's pacing; PROTOCOL.md,
"Measuring the transport overhead"), chunk interval, displayed FPS, the model's generation FPS, the most frames
the page held against the announced buffer, media bytes per second.
Exit status 0 when every run completed and no page held more than its announced buffer, else 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tools.aiperf.telefuser_aiperf.runner import split_passthrough
from tools.bench.stream_latency import browser
from tools.bench.stream_latency.service import add_service_args, running_service, session_frames
from tools.bench.stream_latency.table import print_table

TRANSPORTS = ("websocket", "webrtc")


def parse_args(argv: list[str]) -> argparse.Namespace:
    own, passthrough = split_passthrough(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transports", default="websocket", help="comma-separated: websocket, webrtc (default websocket)")
    p.add_argument("--presses", type=int, default=6, help="key presses per run; each press and release is timed")
    p.add_argument("--hold-s", type=float, default=0.5, help="seconds a key stays down after it showed (default 0.5)")
    p.add_argument("--spread-s", type=float, default=None, help="random pause before each control (default: 1 chunk)")
    p.add_argument("--warmup-s", type=float, default=3.0, help="seconds of playback before the first press")
    p.add_argument("--num-frames", type=int, default=None, help="frames of the session (default: session_frames())")
    p.add_argument("--resolution", default=None, help="session resolution (default: the model's)")
    p.add_argument("--fps", type=float, default=None, help="session FPS (default: the model's)")
    p.add_argument("--control-timeout", type=float, default=60, help="seconds for one control to show")
    p.add_argument("--output", type=Path, default=None, help="write the summaries as JSON")
    add_service_args(p)
    args = p.parse_args(own)
    args.serve_args = passthrough
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    unknown = sorted(set(args.transports) - set(TRANSPORTS))
    if unknown:
        p.error(f"unknown transport(s) {unknown}; choose from {', '.join(TRANSPORTS)}")
    return args


def _get(base: str, path: str, api_key: str | None) -> dict[str, Any]:
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _wait_free(base: str, api_key: str | None, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _get(base, "/v1/service/health", api_key)["sessions_in_use"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the service still holds a session {timeout_s:g} s after the page ended it")
        time.sleep(0.2)


def measure_one(chromium, base: str, transport: str, args: argparse.Namespace, model: str) -> dict[str, Any]:
    page = browser.open_page(chromium, base, transport="auto" if transport == "webrtc" else "websocket",
                             api_key=args.api_key)  # fmt: skip
    try:
        frames = args.num_frames or session_frames(args.presses)
        browser.start_session(page, num_frames=frames, resolution=args.resolution, fps=args.fps,
                              timeout_s=args.control_timeout * 5)  # fmt: skip
        time.sleep(args.warmup_s)
        interval = (page.evaluate("window.tfStream.summary().chunk_interval_mean_ms") or 1000) / 1000
        spread = args.spread_s if args.spread_s is not None else interval
        browser.press_keys(page, args.presses, hold_s=args.hold_s, spread_s=spread, timeout_s=args.control_timeout)
        result = browser.summary(page)
        if result["transport"] != transport:
            raise RuntimeError(f"the page streamed over {result['transport']}, not {transport}")
        page.click("#stop")  # ends after the chunk in progress: done, then the delivery ack
        page.wait_for_function("window.tfStream.ack !== null", timeout=args.control_timeout * 1000)
        result.update(client="browser", model=model, page_errors=list(page.errors))
        return result
    finally:
        page.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from playwright.sync_api import sync_playwright

    if browser.chromium_missing():
        print(f"error: {browser.chromium_missing()}", file=sys.stderr)
        return 1
    extra = ["--webrtc"] if "webrtc" in args.transports else []
    summaries: list[dict[str, Any]] = []
    with running_service(args, extra) as base, sync_playwright() as playwright:
        meta = _get(base, "/v1/service/metadata", args.api_key)
        model = str((meta.get("model") or {}).get("model", "?")).split(" (")[0]
        chromium = browser.launch(playwright)
        try:
            for transport in args.transports:
                print(f"== measuring over {transport}", file=sys.stderr, flush=True)
                summaries.append(measure_one(chromium, base, transport, args, model))
                _wait_free(base, args.api_key)
        finally:
            chromium.close()
    notes = [
        "key->screen: the page sends a control -> it draws the first frame computed under it (performance.now())",
        "generation FPS: the model's frames per compute second; displayed FPS: frames drawn per second of playback",
        "transport: per chunk, the model's output ready (server, before encoding) -> its first frame drawable (decoded;"
        " the next animation frame), less the WebRTC track's pacing wait; the page's playout buffer is not in it",
    ]
    print_table("control-to-display in headless Chromium", summaries, notes)
    if args.output:
        args.output.write_text(json.dumps(summaries, indent=2) + "\n")
    over = [s for s in summaries if s["held_max_frames"] > (s["buffer_frames"] or 0) or s["page_errors"]]
    return 1 if over else 0
