r"""`python -m tools.bench.stream_latency.client`: control-to-display from a Python client that plays a session the way
the page does (playout.py) and timestamps the same way (measure.py); for hosts without a browser, such as the GPU
machine.

    python -m tools.bench.stream_latency.client --fake                            # starts serve-stream --fake here
    python -m tools.bench.stream_latency.client --url http://127.0.0.1:8088      # a service that is running
    # the official FP8 session on one GPU (realtime delivery; the service's flags after --):
    python -m tools.bench.stream_latency.client --config official --checkpoint /path/to/lingbot \
        --presses 10 --startup-timeout 1800 -- --quantization fp8 --warmup on

One session over the WebSocket: create it (the page's bundled image, --num-frames frames), report
playout as the page does, let it play --warmup-s, press and release W --presses times (each after a random pause of
up to one chunk interval, each waiting until the one before showed), stop, acknowledge delivery. A frame counts as
displayed when the simulated page draws it (a 60 Hz display clock at the session's FPS, after decoding its JPEG);
a chunk's transport overhead ends at the first tick after its first frame is decoded (PROTOCOL.md, "Measuring the
transport overhead").
Prints the same row as the browser bench; exit status 1 when a control never showed or the client held more than
the announced buffer.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect

from tools.aiperf.telefuser_aiperf.runner import split_passthrough
from tools.bench.stream_latency.measure import Measure
from tools.bench.stream_latency.playout import PagePlayout
from tools.bench.stream_latency.service import add_service_args, running_service, session_frames
from tools.bench.stream_latency.table import print_table

DEFAULT_IMAGE = Path(__file__).resolve().parents[3] / "telefuser" / "serving" / "stream" / "static" / "default.jpg"


def parse_args(argv: list[str]) -> argparse.Namespace:
    own, passthrough = split_passthrough(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presses", type=int, default=6, help="key presses; each press and release is timed")
    p.add_argument("--hold-s", type=float, default=0.5, help="seconds a key stays down after it showed")
    p.add_argument("--spread-s", type=float, default=None, help="random pause before each control (default: 1 chunk)")
    p.add_argument("--warmup-s", type=float, default=3.0, help="seconds of playback before the first press")
    p.add_argument("--num-frames", type=int, default=None, help="frames of the session (default: session_frames())")
    p.add_argument("--resolution", default=None, help="session resolution (default: the model's)")
    p.add_argument("--fps", type=float, default=None, help="session FPS (default: the model's)")
    p.add_argument("--prompt", default="A stone bridge over a misty river at dawn, slow camera walk.")
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="start frame (default: the page's)")
    p.add_argument("--no-decode", action="store_true", help="do not decode the JPEG frames (the page does)")
    p.add_argument("--control-timeout", type=float, default=120, help="seconds for one control to show")
    p.add_argument("--seed", type=int, default=0, help="of the random pauses")
    p.add_argument("--output", type=Path, default=None, help="write the summary as JSON")
    add_service_args(p)
    args = p.parse_args(own)
    args.serve_args = passthrough
    return args


class LatencyClient:
    def __init__(self, args: argparse.Namespace, base: str):
        self.args, self.base = args, base
        self.measure = Measure()
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.ws = None
        self.playout = PagePlayout(self.measure, self.send, decode=not args.no_decode)
        self.ready: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None
        self.ack: dict[str, Any] | None = None
        self.errors: list[str] = []
        self.seq = 0
        self.shown = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    async def create(self, http: httpx.AsyncClient) -> dict[str, Any]:
        config: dict[str, Any] = {"num_frames": self.args.num_frames or session_frames(self.args.presses)}
        for key in ("resolution", "fps"):
            if getattr(self.args, key):
                config[key] = getattr(self.args, key)
        body = {"prompt": self.args.prompt, "image": base64.b64encode(self.args.image.read_bytes()).decode()}
        r = await http.post(f"{self.base}/v1/stream/sessions", json={**body, "config": config}, timeout=600)
        if r.status_code != 201:
            raise RuntimeError(f"create answered {r.status_code}: {r.text[:300]}")
        return r.json()

    async def run(self) -> dict[str, Any]:
        async with httpx.AsyncClient(headers=self.headers, trust_env=False) as http:
            session = await self.create(http)
        url = "ws" + self.base[4:] + session["ws_path"]
        async with connect(url, max_size=None, open_timeout=60, proxy=None, compression=None) as ws:
            self.ws = ws
            await self.playout.report(True)
            self.playout.start()
            reader = asyncio.create_task(self._read())
            try:
                await self._press_keys()
                await self.send({"type": "stop"})
                await asyncio.wait_for(reader, timeout=self.args.control_timeout)
            finally:
                reader.cancel()
                await self.playout.stop()
        return {**self.measure.summary(), "client": "python", "transport": "websocket",
                "buffer_frames": (self.ready or {}).get("buffer_frames"), "done": self.done, "ack": self.ack,
                "errors": self.errors}  # fmt: skip

    async def _read(self) -> None:
        async for message in self.ws:
            if isinstance(message, bytes):
                self.playout.envelope(message)
                continue
            event = json.loads(message)
            stage = event.get("stage")
            if stage == "runtime_ready":
                self.ready = event
                self.playout.configure(event)
            elif stage == "chunk_sent":
                self.measure.computed(event["frames"], (event.get("measurement") or {}).get("compute_seconds", 0))
            elif stage == "error":
                self.errors.append(event.get("message", ""))
            elif stage == "done":
                self.done, self.playout.done = event, True
                await self.send({"type": "delivery_ack", "published_frames": self.playout.received})
            elif stage in ("delivery_ack", "closed"):
                self.ack = event if stage == "delivery_ack" else self.ack
                return

    async def _wait_shown(self, count: int) -> None:
        deadline = time.monotonic() + self.args.control_timeout
        while len(self.measure.latencies) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"control {count} did not show within {self.args.control_timeout:g} s")
            await asyncio.sleep(0.005)

    async def _press_keys(self) -> None:
        while self.measure.draws == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(self.args.warmup_s)
        rng = random.Random(self.args.seed)
        interval = (self.measure.summary()["chunk_interval_mean_ms"] or 1000) / 1000
        spread = self.args.spread_s if self.args.spread_s is not None else interval
        for _ in range(self.args.presses):
            for keys in (["W"], []):
                await asyncio.sleep(rng.uniform(0, spread))
                self.seq += 1
                self.measure.pressed(self.seq, keys, time.perf_counter())
                await self.send({"type": "control", "keys": keys, "seq": self.seq})
                await self._wait_shown(self.seq)
                await asyncio.sleep(self.args.hold_s if keys else 0)


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with running_service(args) as base:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
                                     trust_env=False) as http:  # fmt: skip
            meta = (await http.get(f"{base}/v1/service/metadata", timeout=30)).json()
        summary = await LatencyClient(args, base).run()
        summary["model"] = str((meta.get("model") or {}).get("model", "?")).split(" (")[0]
        return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    summary = asyncio.run(_main(args))
    print_table("control-to-display from the Python client", [summary], [
        "key->screen: the client sends a control -> its simulated page draws the first frame computed under it",
        "transport: per chunk, the server's computed_at -> its first JPEG decoded and queued, at the next 60 Hz tick",
    ])  # fmt: skip
    if args.output:
        args.output.write_text(json.dumps(summary, indent=2) + "\n")
    over = summary["held_max_frames"] > (summary["buffer_frames"] or 0)
    return 1 if over or summary["pending_controls"] or summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
