#!/usr/bin/env python3
"""Direct stream benchmark of `telefuser serve-stream`: LingBot-World v2 sessions replayed through the real client
protocol (HTTP create, then the session's WebSocket, as the web page does), with the lossless checks, and no AIPerf.

    python3 tools/bench/stream_replay.py --config official                     # the 1-minute replay (GPU, CUDA)
    python3 tools/bench/stream_replay.py --config tiny --device cpu --resolution 64x48 \
        --bench-config tools/aiperf/configs/stream_lingbot_world_v2_ci.yaml    # the 3-chunk CI replay on a CPU
    python3 tools/bench/stream_replay.py --url http://127.0.0.1:8088 --chunks 5   # a service that is running
    python3 tools/bench/stream_replay.py --config official -- --max-frames 2000   # after --: verbatim service flags

Steps: start `python -m telefuser.cli serve-stream` (its own process group, a free loopback port, lossless
delivery; torchrun when --nproc > 1), or use --url -> wait for /v1/service/health -> read /v1/service/metadata ->
scrape /v1/service/metrics -> run --sessions sessions, --concurrency at a time -> scrape the metrics again -> stop the
service (SIGINT to its group, then SIGTERM, then SIGKILL) -> print the table, write the JSON (--output).

The session plan is the AIPerf bench config's (--bench-config, default the one-minute replay: 957 frames = 60 chunks,
16 FPS, seed 42, frame_policy strict, the controls of tools/aiperf/data/stream_controls_1min.json, the prompt and start
frame of its dataset), so both benchmarks replay the same session; --num-frames/--chunks, --controls, --prompt,
--image, --seed, --resolution and --codec override it.

One session: POST /v1/stream/sessions -> WebSocket: per chunk a binary TFCH envelope, then its `chunk_sent` event ->
`done` -> the client sends `delivery_ack` with the frames it received -> the service answers `delivery_ack` (match)
and closes. Controls go as `{"type": "control"}` messages on the same socket and are confirmed by `control_state`.

Controls (--control-timing):
  trace (default): a real viewer. `delay_s` steps at that many seconds of wall clock after chunk 0 arrived,
                   `after_chunk` steps as soon as that chunk arrived, the way the AIPerf transport times them; so this
                   run and the AIPerf run are comparable. Steps still due when the stream ends are not sent (listed).
  asap:            every step in trace order as soon as chunk 0 arrived, each as soon as the service confirmed the
                   one before: how fast the control path takes a burst.
Held keys change what a chunk shows, not how much work it is, so the timing does not move the throughput numbers.
The WebSocket offers permessage-deflate as a browser does (--ws-compression off to measure without it).

Lossless verdict (tools/aiperf/telefuser_aiperf/lossless.py, the checks the AIPerf runner uses): chunk indices
exactly 0..N-1 in order with N the declared chunk count, frame continuity (first_frame), Σ frames == done.published_frames
== the frames asked for, no dropped frames, done reason `completed`, the service's delivery_ack says match; here also:
every envelope well formed and equal to its chunk_sent event (index, frames, first_frame, checksum), every frame
decodes to the session's size (png/raw: its CRC32 equals the model's), no error events, the session's final status
says acked == published == received, and the metrics deltas (frames sent == generated == received, none dropped, one
matching ack per session). --url assumes an otherwise idle service (the deltas count every session).

The numbers, per session (times on this client's clock, time.perf_counter_ns):
  first frame s    arrival of chunk 0's envelope - the start of POST /v1/stream/sessions
  interval s       gaps between consecutive chunk arrivals: mean, p50, p95, max (p95 = sorted[ceil(0.95 n) - 1])
  session FPS      all frames / (arrival of the last chunk - the start of the create): what the viewer got end to end
  steady FPS       frames of chunks 1..N-1 / (arrival of the last chunk - arrival of chunk 0) (summary.client_fps)
  compute FPS      Σ frames / Σ model compute_seconds over chunks >= warmup_chunks (summary.steady_compute_fps)
  phases           the model's per-chunk phase seconds (chunk measurement), mean over the steady chunks; and from the
                   metrics: mean chunk_compute_seconds, encode and backpressure seconds per chunk.

Every wait has a timeout that names what it waited for (--startup-timeout, --connect-timeout, --create-timeout,
--stall-timeout, --ack-wait, --session-timeout, --stop-timeout). Exit status: 0 only when every session completed
losslessly and the service checks passed; 1 when a check failed or the run could not be made; 2 for bad arguments.
Progress goes to stderr (tqdm when it is a terminal, else a line every tenth of the chunks), the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import json
import math
import os
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for _path in (REPO, REPO / "tools" / "aiperf"):  # telefuser (the envelope), telefuser_aiperf (its aiperf-free modules)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from telefuser_aiperf.artifacts import (
    check_stream_service,
    parse_prometheus,
    sample_sum,
    stream_service_deltas,
)
from telefuser_aiperf.controls import ControlStep
from telefuser_aiperf.lossless import check_ack, check_session
from telefuser_aiperf.runner import (
    Service,
    bench_section,
    endpoint_extra,
    format_value,
    free_port,
    load_bench_config,
    model_flags,
    service_command,
    split_passthrough,
    write_json,
)
from telefuser_aiperf.session import SessionOptions, StreamSession, split_options
from telefuser_aiperf.sse import SSEEvent
from telefuser_aiperf.summary import distribution, summarize_session

from telefuser.serving.stream.envelope import chunk_checksum, decode_frames, unpack

try:
    import httpx
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed
except ImportError as _missing:
    raise SystemExit(
        f"stream_replay.py needs httpx and websockets>=14 (the service's own wheels): {_missing}"
    ) from None

DEFAULT_BENCH = REPO / "tools/aiperf/configs/stream_lingbot_world_v2_1min.yaml"
DEFAULT_OUTPUT = REPO / "outputs/bench/stream_replay/summary.json"
PREFIX = "telefuser_stream_"
_now = time.perf_counter_ns


class RunError(Exception):
    """The run could not be made (no service, bad plan); the message says what was waited for or what was wrong."""


# ---- arguments ---------------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    argv, passthrough = split_passthrough(argv)
    p = argparse.ArgumentParser(
        prog="stream_replay.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    s = p.add_argument_group("service (started here unless --url)")
    s.add_argument("--url", default=None, help="benchmark a running service (http://host:port) instead of starting one")
    s.add_argument(
        "--api-key", default=os.environ.get("TELEFUSER_API_KEY"), help="Bearer key (default $TELEFUSER_API_KEY)"
    )
    s.add_argument("--config", choices=("tiny", "official"), default="official", help="model config (default official)")
    s.add_argument("--checkpoint", default=None, help="checkpoint directory (the service uses random weights without)")
    s.add_argument("--device", default=None, help="cpu, cuda, ... (default: the service's: its GPU, else cpu)")
    s.add_argument("--dtype", default=None, help="model dtype (default: the service's, bfloat16 on CUDA)")
    s.add_argument("--quantization", default=None, help="none | fp8 (default: the service's, none)")
    s.add_argument("--vae-dtype", default=None, help="passed on as --vae-dtype when given (the service must have it)")
    s.add_argument("--attn-impl", default=None)
    s.add_argument("--warmup", choices=("auto", "on", "off"), default=None, help="service warm-up (default auto: CUDA)")
    s.add_argument("--buffer-chunks", type=int, default=None, help="the service's delivery queue, in chunks")
    s.add_argument("--jpeg-quality", type=int, default=None)
    s.add_argument("--max-sessions", type=int, default=None, help="default: --concurrency")
    s.add_argument("--fake", action="store_true", help="the service's test-pattern model instead of LingBot-World v2")
    s.add_argument("--fake-delay", type=float, default=0.25, help="--fake: seconds of 'compute' per chunk")
    s.add_argument("--nproc", type=int, default=1, help="ranks; > 1 runs the service under torchrun")
    s.add_argument("--port", type=int, default=None, help="default: a free port")
    s.add_argument("--python", default=sys.executable, help="interpreter of the service (default: this one)")
    s.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the service (default: inherited)")
    s.add_argument("--service-log", type=Path, default=None, help="default: service.log beside --output")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds for a started service to be healthy")
    s.add_argument("--connect-timeout", type=float, default=30.0, help="seconds for --url to be healthy; WS handshake")
    s.add_argument("--stop-timeout", type=float, default=60.0, help="seconds after SIGINT before SIGTERM, SIGKILL")
    w = p.add_argument_group("sessions")
    w.add_argument("--bench-config", type=Path, default=DEFAULT_BENCH, help="AIPerf YAML whose session plan to replay")
    frames = w.add_mutually_exclusive_group()
    frames.add_argument("--num-frames", type=int, default=None, help="frames per session (default: the bench config's)")
    frames.add_argument("--chunks", type=int, default=None, help="chunks per session (frames from the model's chunks)")
    w.add_argument("--controls", default=None, help="control trace JSON (default: the bench config's; '' for none)")
    w.add_argument("--control-timing", choices=("trace", "asap"), default="trace", help="see the description")
    w.add_argument("--prompt", default=None, help="default: the bench config's dataset")
    w.add_argument("--image", type=Path, default=None, help="start frame (default: the bench config's dataset)")
    w.add_argument("--seed", type=int, default=None)
    w.add_argument("--resolution", default=None, help="WxH, the session's and the started service's default")
    w.add_argument("--codec", choices=("jpeg", "png", "raw"), default=None, help="frame codec (default: the service's)")
    w.add_argument("--sessions", type=int, default=1, help="sessions to run (default 1)")
    w.add_argument("--concurrency", type=int, default=1, help="sessions at a time (default 1)")
    w.add_argument("--ws-compression", choices=("deflate", "off"), default="deflate", help="deflate: as a browser")
    w.add_argument("--no-decode", action="store_true", help="do not decode the frames (sizes and counts still checked)")
    w.add_argument("--create-timeout", type=float, default=600.0, help="seconds for the create answer")
    w.add_argument("--slot-wait", type=float, default=120.0, help="seconds to retry a create answered 429 (busy)")
    w.add_argument("--stall-timeout", type=float, default=300.0, help="longest silence on the WebSocket, in seconds")
    w.add_argument("--ack-wait", type=float, default=30.0, help="seconds for the service's delivery_ack answer")
    w.add_argument("--session-timeout", type=float, default=7200.0, help="seconds one whole session may take")
    w.add_argument("--no-metric-checks", action="store_true", help="report the metrics deltas but do not judge them")
    o = p.add_argument_group("output")
    o.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON summary (default %(default)s)")
    o.add_argument("--progress", choices=("auto", "tqdm", "lines", "none"), default="auto")
    args = p.parse_args(argv)
    args.passthrough = passthrough
    for name in ("sessions", "concurrency", "nproc"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.chunks is not None and args.chunks < 1:
        p.error("--chunks must be >= 1")
    if args.url and (args.fake or passthrough):
        p.error("--fake and service flags after -- need a service started here, not --url")
    return args


# ---- the plan ----------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    options: SessionOptions
    prompts: list[tuple[str, str, str]]  # (prompt, base64 image, image path)
    source: dict[str, Any]


def _resolve(path: str | Path) -> Path:
    path = Path(path)
    return path if path.is_absolute() or path.exists() else REPO / path


def load_plan(args: argparse.Namespace, chunk_frames: tuple[int, int] | None = None) -> Plan:
    """The bench config's session options with the command line's overrides; RunError names what is wrong."""
    try:
        config = load_bench_config(_resolve(args.bench_config))
    except (OSError, ValueError) as exc:
        raise RunError(f"cannot read the bench config {args.bench_config}: {exc}") from exc
    overrides: dict[str, Any] = {}
    if args.num_frames is not None:
        overrides["num_frames"] = args.num_frames
    elif args.chunks is not None and chunk_frames is not None:
        first, later = chunk_frames
        overrides["num_frames"] = first + (args.chunks - 1) * later
    for key in ("seed", "resolution", "codec"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.controls is not None:
        overrides["controls"] = str(_resolve(args.controls)) if args.controls else None
    try:
        options = split_options(endpoint_extra(config), overrides, base_dir=REPO)
    except (OSError, ValueError) as exc:
        raise RunError(f"bad session plan ({args.bench_config}, overrides {overrides}): {exc}") from exc
    if options.requested_frames is None:
        raise RunError("the plan must fix num_frames (a lossless check needs the frame count); use --num-frames")
    rows: list[dict[str, Any]] = []
    if args.prompt is None or args.image is None:
        dataset = _resolve((bench_section(config).get("dataset") or {}).get("path") or "")
        try:
            rows = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            raise RunError(f"cannot read the dataset {dataset} of {args.bench_config}: {exc}") from exc
        if not rows:
            raise RunError(f"the dataset {dataset} has no rows")
    prompts = []
    for row in rows or [{}]:
        prompt = args.prompt if args.prompt is not None else row.get("text")
        image = _resolve(args.image if args.image is not None else row.get("image") or "")
        if not isinstance(prompt, str) or not prompt.strip():
            raise RunError(f"no prompt in the dataset row {row}; give --prompt")
        try:
            prompts.append((prompt, base64.b64encode(image.read_bytes()).decode("ascii"), str(image)))
        except OSError as exc:
            raise RunError(f"cannot read the start frame {image}: {exc}") from exc
    source = {"bench_config": str(args.bench_config), "overrides": overrides, "controls_steps": len(options.controls)}
    return Plan(options=options, prompts=prompts, source=source)


# ---- progress ----------------------------------------------------------------------------------------------------
class Progress:
    def __init__(self, mode: str, number: int, total: int | None):
        self.number, self.total, self.bar, self.mode = number, total, None, mode
        self.step = max(1, (total or 10) // 10)
        self.started = time.monotonic()
        if mode in ("auto", "tqdm"):
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None and (mode == "tqdm" or sys.stderr.isatty()):
                self.bar = tqdm(
                    total=total, desc=f"session {number}", unit="chunk", file=sys.stderr, position=number - 1
                )
            self.mode = "tqdm" if self.bar is not None else "lines"

    def chunk(self, index: int, frames: int) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(frames=frames, refresh=False)
        elif self.mode == "lines" and (index % self.step == 0 or (self.total and index + 1 == self.total)):
            elapsed = time.monotonic() - self.started
            log(f"session {self.number}: chunk {index + 1}/{self.total} ({frames} frames, {elapsed:.1f} s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def log(message: str) -> None:
    print(f"== {message}", file=sys.stderr, flush=True)


# ---- one session over the WebSocket ------------------------------------------------------------------------------
def check_frames(header: dict[str, Any], images: list[bytes]) -> tuple[list[str], int, int]:
    """Decode a chunk's frames: (problems, frames decoded, CRC32s compared). Runs in a worker thread."""
    index = header.get("chunk")
    try:
        frames = decode_frames(header, images)
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds; an undecodable frame is a finding
        return [f"chunk {index}: its frames do not decode: {type(exc).__name__}: {exc}"], 0, 0
    want = (len(images), header["height"], header["width"], 3)
    if tuple(frames.shape) != want:
        return [f"chunk {index}: decoded frames are {tuple(frames.shape)}, the header says {want}"], len(frames), 0
    if header.get("codec") not in ("png", "raw"):
        return [], len(frames), 0  # jpeg is lossy: its crc32 is the model's raw frame, not what decodes
    crcs = [zlib.crc32(f.tobytes()) for f in frames]
    bad = [i for i, (a, b) in enumerate(zip(crcs, header.get("crc32") or [], strict=False)) if a != b]
    if bad or len(crcs) != len(header.get("crc32") or []):
        return [f"chunk {index}: frame(s) {bad[:5]} differ from the model's (CRC32 mismatch)"], len(frames), len(crcs)
    return [], len(frames), len(crcs)


@dataclass
class Context:
    args: argparse.Namespace
    base: str
    http: httpx.AsyncClient
    plan: Plan
    decoder: concurrent.futures.Executor
    ws_headers: dict[str, str] = field(default_factory=dict)


class SessionReplay:
    def __init__(self, number: int, ctx: Context):
        self.number, self.ctx, self.args = number, ctx, ctx.args
        self.prompt, self.image, self.image_path = ctx.plan.prompts[(number - 1) % len(ctx.plan.prompts)]
        self.state = StreamSession(ctx.plan.options, _now())
        self.protocol: list[str] = []  # envelope/event mismatches, decode failures, final status
        self.warnings: list[str] = []
        self.decodes: list[asyncio.Future] = []
        self.decoded = self.crc_checked = 0
        self.pending: tuple[dict[str, Any], list[bytes], int] | None = None
        self.headers: dict[int, dict[str, Any]] = {}
        self.first_chunk = asyncio.Event()
        self.confirmed: dict[int, asyncio.Event] = {}
        self.control_tasks: list[asyncio.Task] = []
        self.created_ns = self.connected_ns = self.ended_ns = None
        self.waiting_for = "the create answer"
        self.finished = self.ack_sent = False
        self.final_status: dict[str, Any] | None = None
        self.progress: Progress | None = None
        self.ws = None  # the open WebSocket, for controls sent from the receive loop

    # ---- the run ---------------------------------------------------------------------------------------------------
    async def run(self) -> SessionReplay:
        deadline = asyncio.timeout(self.args.session_timeout)
        try:
            async with deadline:
                if await self._create():
                    await self._stream()
        except TimeoutError as exc:
            if not deadline.expired():  # the WebSocket handshake's own timeout
                self._ended(f"timed out waiting for {self.waiting_for}: {exc!r}")
                return self
            self._ended(
                f"the session did not finish within --session-timeout {self.args.session_timeout:g} s "
                f"(it was waiting for {self.waiting_for})"
            )
        except Exception as exc:  # noqa: BLE001 - refused, reset, a bad answer: this session failed, not the run
            self._ended(f"the session failed while waiting for {self.waiting_for}: {type(exc).__name__}: {exc}")
        finally:
            self.ended_ns = self.ended_ns or _now()
            if self.progress is not None:
                self.progress.close()
            await self._settle()
        return self

    def _ended(self, reason: str) -> None:
        if self.state.done is None:
            self.state.stream_ended(reason)
        elif self.state.ack_answer is None and not self.state.ack_problems:
            self.state.ack_problems = [reason]
        else:
            self.protocol.append(reason)

    async def _create(self) -> bool:
        http, url = self.ctx.http, f"{self.ctx.base}/v1/stream/sessions"
        body = self.ctx.plan.options.body(self.prompt, self.image)
        deadline = time.monotonic() + self.args.slot_wait
        while True:
            self.state.start_ns = _now()
            try:
                r = await http.post(url, json=body, timeout=self.args.create_timeout)
            except httpx.HTTPError as exc:
                self._ended(f"POST {url} failed (timeout {self.args.create_timeout:g} s): {type(exc).__name__}: {exc}")
                return False
            if r.status_code == 429 and time.monotonic() < deadline:  # the slot of the session before is not free yet
                try:
                    retry_after = float(r.headers.get("retry-after") or 1)
                except ValueError:
                    retry_after = 1.0
                await asyncio.sleep(min(5.0, max(0.5, retry_after)))
                continue
            break
        self.created_ns = _now()
        if not 200 <= r.status_code < 300:
            busy = f" after retrying for --slot-wait {self.args.slot_wait:g} s" if r.status_code == 429 else ""
            self._ended(f"POST {url} answered {r.status_code}{busy}: {r.text[:500]}")
            return False
        try:
            self.state.created(r.json())
        except ValueError as exc:
            self._ended(f"POST {url} answered {r.status_code} with an unusable body: {exc}")
            return False
        total = self.state.expected_chunks
        self.progress = Progress(self.args.progress, self.number, total)
        log(
            f"session {self.number}: {self.state.session_id} created in {(self.created_ns - self.state.start_ns) / 1e9:.2f}"
            f" s: {total} chunks, {self.state.create_answer.get('total_frames')} frames, "
            f"{self.state.create_answer.get('resolution')}, codec {self.state.create_answer.get('codec')}"
        )
        return True

    async def _stream(self) -> None:
        answer = self.state.create_answer or {}
        ws_url = ("wss" + self.ctx.base[5:] if self.ctx.base.startswith("https") else "ws" + self.ctx.base[4:]) + str(
            answer.get("ws_path") or f"/v1/stream/sessions/{self.state.session_id}/ws"
        )
        self.waiting_for = f"the WebSocket handshake (--connect-timeout {self.args.connect_timeout:g} s)"
        async with connect(
            ws_url,
            max_size=None,
            proxy=None,
            open_timeout=self.args.connect_timeout,
            close_timeout=10,
            ping_interval=None,  # silence is judged by --stall-timeout
            compression="deflate" if self.args.ws_compression == "deflate" else None,
            additional_headers=self.ctx.ws_headers or None,
        ) as ws:
            self.connected_ns, self.ws = _now(), ws
            timed = asyncio.create_task(self._controls(ws))
            try:
                await self._receive(ws)
            finally:
                self.finished = True
                timed.cancel()
                _, late = await asyncio.wait([timed, *self.control_tasks], timeout=30)
                for task in late:
                    task.cancel()
                    self.warnings.append("a control send did not finish within 30 s of the stream's end")

    async def _receive(self, ws) -> None:
        while True:
            if self.ack_sent:
                limit, self.waiting_for = self.args.ack_wait, "the service's delivery_ack answer"
            else:
                limit = self.args.stall_timeout
                self.waiting_for = f"chunk {len(self.state.chunks)} of {self.state.expected_chunks}"
                if self.pending is not None:
                    self.waiting_for = f"the chunk_sent event of chunk {self.pending[0].get('chunk')}"
            try:
                message = await asyncio.wait_for(ws.recv(), limit)
            except TimeoutError:
                self._ended(f"no message from the service for {limit:g} s while waiting for {self.waiting_for}")
                return
            except ConnectionClosed as exc:
                close = exc.rcvd
                how = f"code {close.code} {close.reason!r}" if close is not None else "no close frame"
                self._ended(f"the WebSocket closed ({how}) while waiting for {self.waiting_for}")
                return
            t = _now()
            if isinstance(message, bytes):
                self._on_envelope(message, t)
                continue
            try:
                event = json.loads(message)
                stage = event.get("stage")
            except (ValueError, AttributeError):
                self.protocol.append(f"unreadable text message from the service: {message[:200]!r}")
                continue
            if stage == "chunk_sent":
                self._on_chunk_sent(event)
            elif stage in ("runtime_ready", "control_state"):
                self.state.on_event(SSEEvent(perf_ns=t, event="status", data=message))
                if stage == "control_state":
                    self._on_control_state(t)
                elif event.get("total_chunks") != self.state.expected_chunks:
                    self.protocol.append(
                        f"runtime_ready declares {event.get('total_chunks')} chunks, the create "
                        f"answer {self.state.expected_chunks}"
                    )
            elif stage == "error":
                if self.state.on_event(SSEEvent(perf_ns=t, event="error", data=message)) == "fatal":
                    return
            elif stage == "done":
                self.state.on_event(SSEEvent(perf_ns=t, event="done", data=message))
                try:
                    await ws.send(json.dumps({"type": "delivery_ack", "published_frames": self.state.counted_frames}))
                except ConnectionClosed as exc:
                    self._ended(f"the WebSocket closed before our delivery_ack could be sent: {exc}")
                    return
                self.ack_sent = True
            elif stage == "delivery_ack":
                self.state.record_ack(event, None)
                return
            elif stage == "closed":
                self.state.on_event(SSEEvent(perf_ns=t, event="closed", data=message))
                self._ended(f"the service closed the stream (reason {event.get('reason')!r}) before its delivery_ack")
                return

    def _on_envelope(self, data: bytes, t: int) -> None:
        try:
            header, images = unpack(data)
            index = int(header["chunk"])
        except (ValueError, KeyError, TypeError) as exc:  # a malformed envelope (JSON errors are ValueErrors)
            self.protocol.append(f"binary message #{len(self.state.chunks)} is not a TFCH chunk envelope: {exc}")
            return
        if self.pending is not None:
            self.protocol.append(f"chunk {self.pending[0].get('chunk')}'s envelope had no chunk_sent event")
        self.pending = (header, images, t)
        if not self.args.no_decode:
            loop = asyncio.get_running_loop()
            self.decodes.append(loop.run_in_executor(self.ctx.decoder, check_frames, header, images))
        if self.progress is not None:
            self.progress.chunk(index, self.state.counted_frames + len(images))

    def _on_chunk_sent(self, event: dict[str, Any]) -> None:
        if self.pending is None:
            self.protocol.append(f"chunk_sent for chunk {event.get('chunk')} arrived without its envelope")
            return
        header, images, t = self.pending
        self.pending = None
        index = header.get("chunk")
        for key in ("chunk", "frames", "first_frame"):
            if event.get(key) != header.get(key):
                self.protocol.append(f"chunk {index}: envelope {key}={header.get(key)}, chunk_sent {event.get(key)}")
        crcs = header.get("crc32") or []
        if len(crcs) != header.get("frames") or event.get("checksum") != chunk_checksum(list(crcs)):
            self.protocol.append(f"chunk {index}: the envelope's CRC32s do not give chunk_sent's checksum")
        if header.get("width") and header.get("height"):
            expected = f"{header['width']}x{header['height']}"
            resolution = (self.state.create_answer or {}).get("resolution")
            if resolution and resolution != expected:
                self.protocol.append(f"chunk {index}: {expected} frames in a {resolution} session")
        data = {
            **event,
            "type": "chunk",
            "chunk": index,
            "frames": header.get("frames"),
            "first_frame": header.get("first_frame"),
            "image_bytes": [len(b) for b in images],
        }
        try:
            self.state.on_event(SSEEvent(perf_ns=t, event="chunk", data=json.dumps(data)))
        except ValueError as exc:  # ChunkObservation: a chunk index or frame count that is not an integer
            self.protocol.append(f"chunk {index}: {exc}")
            return
        self.headers[int(index)] = {
            "bytes": sum(len(b) for b in images),
            "queue_depth": event.get("queue_depth"),
            "encode_s": event.get("encode_seconds"),
        }
        if len(self.state.chunks) == 1:
            self.first_chunk.set()
        if self.args.control_timing == "trace" and self.ws is not None:
            for step in self.state.controls_after_chunk(int(index)):
                self.control_tasks.append(asyncio.create_task(self._send_control(self.ws, step)))

    def _on_control_state(self, t: int) -> None:
        for number, result in enumerate(self.state.controls):
            if result.state_ns == t and result.answered_ns is None:
                result.answered_ns = t
                result.answer = next(p for n, p in reversed(self.state.status_events) if n == t)
                self.confirmed.setdefault(number, asyncio.Event()).set()

    # ---- controls --------------------------------------------------------------------------------------------------
    async def _controls(self, ws) -> None:
        await self.first_chunk.wait()
        if self.args.control_timing == "asap":
            for step in sorted(self.state.options.controls, key=lambda s: s.number):
                if self.finished or self.state.done is not None:
                    return
                number = await self._send_control(ws, step)
                if number is not None:
                    event = self.confirmed.setdefault(number, asyncio.Event())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), self.args.ack_wait)
            return
        base = self.state.first_chunk_ns
        for step in self.state.timed_controls():
            wait_s = (base + step.delay_s * 1e9 - _now()) / 1e9
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if self.finished or self.state.done is not None:
                return
            await self._send_control(ws, step)

    async def _send_control(self, ws, step: ControlStep) -> int | None:
        if self.finished or self.state.done is not None:
            return None
        result = self.state.control_sent(step, _now())
        try:
            await ws.send(json.dumps({"type": "control", "keys": list(step.keys)}))
        except ConnectionClosed as exc:  # the socket closed under us; the stream's end says why
            result.answer = f"not sent: {type(exc).__name__}: {exc}"
            return None
        return len(self.state.controls) - 1

    # ---- after the stream ------------------------------------------------------------------------------------------
    async def _settle(self) -> None:
        if self.pending is not None:
            self.protocol.append(f"chunk {self.pending[0].get('chunk')}'s envelope had no chunk_sent event")
        if self.decodes:
            done, late = await asyncio.wait(self.decodes, timeout=120)
            if late:
                self.protocol.append(f"{len(late)} chunk(s) were still decoding after 120 s")
            for future in done:
                if future.cancelled() or future.exception() is not None:
                    self.protocol.append(f"checking a chunk's frames failed: {future!r}")
                    continue
                problems, decoded, checked = future.result()
                self.protocol += problems
                self.decoded += decoded
                self.crc_checked += checked
        sid = self.state.session_id
        if sid is None:
            return
        url = f"{self.ctx.base}/v1/stream/sessions/{sid}"
        if self.state.done is None:  # free the slot of a session that did not end normally
            with contextlib.suppress(Exception):
                await self.ctx.http.delete(url, timeout=10)
        try:
            r = await self.ctx.http.get(url, timeout=10)
            self.final_status = r.json() if r.status_code == 200 else {"status_code": r.status_code, "body": r.text}
        except (httpx.HTTPError, ValueError) as exc:
            self.final_status = {"error": f"GET {url} failed: {type(exc).__name__}: {exc}"}

    def problems(self) -> list[str]:
        state, answer = self.state, self.state.create_answer or {}
        declared = answer.get("total_frames")
        problems = check_session(
            state.chunks,
            state.done,
            requested_frames=state.options.requested_frames,
            expected_chunks=state.expected_chunks,
            declared_frames=declared if isinstance(declared, int) else None,
            end_reason=state.end_reason,
        )
        problems += state.service_errors + self.protocol
        if state.done is not None:
            if state.ack_problems:
                problems += state.ack_problems
            elif state.ack_answer is None:
                problems += check_ack(None, state.counted_frames)
            final = self.final_status or {}
            counted = state.counted_frames
            if (final.get("acked_frames"), final.get("published_frames"), final.get("ack_match")) != (
                counted,
                counted,
                True,
            ):
                problems.append(
                    f"the session's final status says published {final.get('published_frames')}, acked "
                    f"{final.get('acked_frames')}, ack_match {final.get('ack_match')}; the client received {counted}"
                )
        return problems

    def report(self) -> dict[str, Any]:
        state = self.state
        start = state.start_ns
        options = state.options
        summary = summarize_session(
            state.chunks,
            start_ns=start,
            warmup_chunks=int(options.harness["warmup_chunks"]),
            target_fps=options.harness.get("target_fps") or options.config.get("fps"),
        )
        intervals = [(b.perf_ns - a.perf_ns) / 1e9 for a, b in zip(state.chunks, state.chunks[1:], strict=False)]
        steady = max(1, summary["steady_chunks"])
        last = max((c.perf_ns for c in state.chunks), default=None)
        frames = summary["frames"]
        problems = self.problems()
        controls = []
        for result in state.controls:
            row = result.as_dict(start)
            row.pop("status", None)
            row["confirmed"] = result.answered_ns is not None
            row["latency_ms"] = (
                None if result.answered_ns is None else round((result.answered_ns - result.sent_ns) / 1e6, 3)
            )
            controls.append(row)
        unconfirmed = [c for c in controls if not c["confirmed"]]
        if unconfirmed:
            self.warnings.append(f"{len(unconfirmed)} control(s) sent without a control_state before the stream ended")
        skipped = [s.describe() for s in state.skipped_controls()]
        if skipped:
            self.warnings.append(f"{len(skipped)} control step(s) not sent: the stream ended first")
        return {
            "session": self.number,
            "session_id": state.session_id,
            "prompt": self.prompt,
            "image": self.image_path,
            "passed": not problems,
            "problems": problems,
            "warnings": self.warnings,
            "requested_frames": options.requested_frames,
            "expected_chunks": state.expected_chunks,
            "frames": frames,
            "chunks": summary["chunks"],
            "resolution": (state.create_answer or {}).get("resolution"),
            "codec": (state.create_answer or {}).get("codec"),
            "create_s": _seconds(self.created_ns, start),
            "ws_connected_s": _seconds(self.connected_ns, start),
            "first_frame_s": summary["first_frame_latency_s"],
            "last_chunk_s": _seconds(last, start),
            "chunk_interval_s": _dist(intervals),
            "session_fps": None if last is None or last <= start else round(frames / ((last - start) / 1e9), 4),
            "steady_fps": summary["client_fps"],
            "steady_compute_fps": summary["steady_compute_fps"],
            "target_fps": summary.get("target_fps"),
            "warmup_chunks": summary["warmup_chunks"],
            "chunk_compute_s": summary["chunk_compute_s"],
            "warmup_chunk_compute_s": summary["warmup_chunk_compute_s"],
            "steady_phase_mean_s": {k: round(v / steady, 6) for k, v in summary["steady_phase_seconds"].items()},
            "frames_decoded": self.decoded,
            "frames_crc_checked": self.crc_checked,
            "bytes_received": sum(h["bytes"] for h in self.headers.values()),
            "done": state.done,
            "end_reason": state.end_reason,
            "ack": state.ack_answer,
            "final_status": self.final_status,
            "controls": controls,
            "control_latency_ms": distribution([c["latency_ms"] for c in controls if c["latency_ms"] is not None], 3),
            "controls_skipped": skipped,
            "per_chunk": [
                {
                    "index": c.index,
                    "frames": c.frames,
                    "first_frame": c.first_frame,
                    "arrival_s": _seconds(c.perf_ns, start),
                    "compute_s": None if c.compute_seconds is None else round(c.compute_seconds, 6),
                    **self.headers.get(c.index, {}),
                    "phases": c.phases,
                }
                for c in state.chunks
            ],
        }


def _seconds(t: int | None, start: int) -> float | None:
    return None if t is None else round((t - start) / 1e9, 6)


def _dist(values: list[float]) -> dict[str, Any] | None:
    """summary.distribution (count, p50, p90, max, mean) plus p95 by nearest rank: sorted[ceil(0.95 n) - 1]."""
    out = distribution(values)
    if out is not None:
        out["p95"] = round(sorted(values)[math.ceil(0.95 * len(values)) - 1], 6)
    return out


# ---- the service -------------------------------------------------------------------------------------------------
def service_args(args: argparse.Namespace, port: int) -> list[str]:
    out = ["--host", "127.0.0.1", "--port", str(port), "--delivery-mode", "lossless", "--log-level", args.log_level]
    out += ["--max-sessions", str(args.max_sessions or args.concurrency)]
    optional = {
        "--checkpoint": args.checkpoint,
        "--device": args.device,
        "--dtype": args.dtype,
        "--quantization": args.quantization,
        "--vae-dtype": args.vae_dtype,
        "--attn-impl": args.attn_impl,
        "--warmup": args.warmup,
        "--resolution": args.resolution,
        "--buffer-chunks": args.buffer_chunks,
        "--jpeg-quality": args.jpeg_quality,
    }
    return out + model_flags(args, ["--fake", "--fake-delay", str(args.fake_delay)], optional) + args.passthrough


async def wait_healthy(http, base: str, timeout_s: float, service: Service | None) -> float:
    """Poll GET /v1/service/health until it answers 200 {"status": "ok"}; RunError names what did not happen."""
    started, last = time.monotonic(), "no answer yet"
    url = f"{base}/v1/service/health"
    while time.monotonic() - started < timeout_s:
        if service is not None and service.proc.poll() is not None:
            raise RunError(
                f"the service exited with {service.proc.returncode} before {url} was healthy; "
                f"its log ({service.log_path}) ends:\n{service.tail()}"
            )
        try:
            r = await http.get(url, timeout=5)
            if r.status_code == 200 and r.json().get("status") == "ok":
                return time.monotonic() - started
            last = f"{r.status_code} {r.text[:200]}"
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(1.0 if service is not None else 0.5)
    tail = f"; its log ({service.log_path}) ends:\n{service.tail()}" if service is not None else ""
    raise RunError(f"GET {url} did not answer 200 status ok within {timeout_s:g} s (last: {last}){tail}")


async def get_json(http, url: str, what: str) -> Any:
    try:
        r = await http.get(url, timeout=30)
    except Exception as exc:
        raise RunError(f"GET {url} ({what}) failed within 30 s: {type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        raise RunError(f"GET {url} ({what}) answered {r.status_code}: {r.text[:300]}")
    return r.json() if what != "metrics" else parse_prometheus(r.text)


def metric_phases(deltas: dict[str, float], before, after) -> dict[str, Any]:
    """What the Prometheus deltas say per chunk (server side)."""

    def delta(name: str) -> float:
        return sample_sum(after, PREFIX + name) - sample_sum(before, PREFIX + name)

    chunks = deltas["chunks_generated_total"]
    count, total = delta("chunk_compute_seconds_count"), delta("chunk_compute_seconds_sum")
    return {
        "chunk_compute_mean_s": round(total / count, 6) if count else None,
        "encode_per_chunk_s": round(delta("encode_seconds_total") / chunks, 6) if chunks else None,
        "backpressure_s": round(deltas["backpressure_seconds_total"], 6),
        "bytes_sent": delta("bytes_sent_total"),
        "client_messages_dropped": delta("client_messages_dropped_total"),
        "notices_dropped": delta("notices_dropped_total"),
    }


# ---- the run -----------------------------------------------------------------------------------------------------
async def replay(args: argparse.Namespace, summary: dict[str, Any], holder: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    plan = load_plan(args)  # fail on a bad plan before a model is loaded
    async with httpx.AsyncClient(trust_env=False, headers=headers, timeout=30) as http:
        if args.url:
            base = args.url.rstrip("/")
            ready = await wait_healthy(http, base, args.connect_timeout, None)
        else:
            port = args.port or free_port()
            base = f"http://127.0.0.1:{port}"
            cmd = service_command(args.python, "serve-stream", args.nproc, service_args(args, port))
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            if args.threads:
                env["OMP_NUM_THREADS"] = str(args.threads)
            log_path = args.service_log or args.output.parent / "service.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.redirect_stdout(sys.stderr):
                holder["service"] = Service(cmd, log_path, env=env)
            summary["service"].update(command=cmd, log=str(log_path))
            log(f"waiting up to {args.startup_timeout:g} s for {base}/v1/service/health (model load, warm-up)")
            ready = await wait_healthy(http, base, args.startup_timeout, holder["service"])
        summary["service"].update(url=base, ready_s=round(ready, 3))
        log(f"service healthy at {base} after {ready:.1f} s")
        metadata = await get_json(http, f"{base}/v1/service/metadata", "metadata")
        model = metadata.get("model") or {}
        summary["service"]["metadata"] = {"model": model, "limits": metadata.get("limits")}
        if args.chunks is not None:
            cf = model.get("chunk_frames") or {}
            if not isinstance(cf.get("first"), int) or not isinstance(cf.get("later"), int):
                raise RunError(
                    f"--chunks needs the model's chunk_frames in the metadata (got {cf!r}); give --num-frames"
                )
            plan = load_plan(args, (cf["first"], cf["later"]))
        options = plan.options
        summary["plan"] = {
            **plan.source,
            "config": options.config,
            "codec": options.wire.get("codec") or metadata.get("default_codec"),
            "controls": [
                {"keys": list(s.keys), "delay_s": s.delay_s, "after_chunk": s.after_chunk} for s in options.controls
            ],
            "control_timing": args.control_timing,
            "sessions": args.sessions,
            "concurrency": args.concurrency,
        }
        before = await get_json(http, f"{base}/v1/service/metrics", "metrics")
        ctx = Context(args, base, http, plan, holder["decoder"], headers)
        gate = asyncio.Semaphore(args.concurrency)
        log(
            f"{args.sessions} session(s) of {options.requested_frames} frames, {args.concurrency} at a time, "
            f"controls: {len(options.controls)} step(s), timing {args.control_timing}"
        )

        async def one(number: int) -> None:
            async with gate:
                replay = SessionReplay(number, ctx)
                holder["replays"].append(replay)  # reported even when the run is cut short
                await replay.run()

        holder["started_ns"] = _now()
        await asyncio.gather(*(one(n) for n in range(1, args.sessions + 1)))
        holder["wall_s"] = (_now() - holder["started_ns"]) / 1e9
        after = await get_json(http, f"{base}/v1/service/metrics", "metrics")
        deltas = stream_service_deltas(before, after)
        summary["service_metrics"] = {"deltas": deltas, **metric_phases(deltas, before, after)}
        if not args.no_metric_checks:
            frames = sum(r.state.counted_frames for r in holder["replays"])
            checks = check_stream_service(deltas, len(holder["replays"]), frames)
            summary["problems"] += [f"service metrics: {p}" for p in checks]


def add_sessions(summary: dict[str, Any], holder: dict[str, Any]) -> None:
    """The per-session reports and the aggregate, also of sessions that a failure or a signal cut short."""
    replays, started = holder["replays"], holder.get("started_ns")
    if not replays:
        return
    reports = [r.report() for r in replays]
    summary["sessions"] = reports
    frames = sum(r["frames"] for r in reports)
    last = max((c.perf_ns for r in replays for c in r.state.chunks), default=None)
    summary["aggregate"] = {
        "sessions": len(reports),
        "frames": frames,
        "chunks": sum(r["chunks"] for r in reports),
        "wall_s": None if holder.get("wall_s") is None else round(holder["wall_s"], 3),
        "delivered_fps": None if last is None or started is None else round(frames / ((last - started) / 1e9), 4),
        "first_frame_s": _dist([r["first_frame_s"] for r in reports if r["first_frame_s"] is not None]),
    }
    summary["problems"] = [f"session {r['session']}: {p}" for r in reports for p in r["problems"]] + summary["problems"]
    summary["warnings"] += [f"session {r['session']}: {w}" for r in reports for w in r["warnings"]]


def stop_service(args: argparse.Namespace, summary: dict[str, Any], service: Service | None) -> None:
    if service is None:
        return
    log(f"stopping the service (SIGINT to its process group, {args.stop_timeout:g} s before SIGTERM)")
    with contextlib.redirect_stdout(sys.stderr):
        rc = service.stop(timeout_s=args.stop_timeout)
    summary["service"]["exit_code"] = rc
    if not service.stopped_cleanly(rc, torchrun=args.nproc > 1):
        summary["problems"].append(f"the service did not exit cleanly (exit code {rc}); see {service.log_path}")


def print_table(summary: dict[str, Any]) -> None:
    meta = ((summary.get("service") or {}).get("metadata") or {}).get("model") or {}
    plan = summary.get("plan") or {}
    print("\n== TeleFuser stream replay (WebSocket client, no AIPerf)")
    if meta:
        warmup = f"warm-up {meta['warmup_s']} s" if meta.get("warmup_s") is not None else "no warm-up"
        print(
            f"   model {meta.get('model')} ({meta.get('weights')}) on {meta.get('device')}, {warmup}, "
            f"transport {meta.get('ulysses_transport')}"
        )
    if plan:
        config = plan.get("config") or {}
        print(
            f"   plan {config.get('num_frames')} frames at {config.get('resolution') or 'the default resolution'}, "
            f"{config.get('fps')} fps, seed {config.get('seed')}, {config.get('frame_policy')}; codec "
            f"{plan.get('codec')}; {len(plan.get('controls') or [])} control step(s) on the "
            f"{plan.get('control_timing')} clock; {plan.get('sessions')} session(s), {plan.get('concurrency')} at a time"
        )
    head = (
        "session",
        "frames",
        "chunks",
        "first frame s",
        "interval mean/p50/p95/max s",
        "session FPS",
        "steady FPS",
        "compute FPS",
        "lossless",
    )
    rows = []
    for r in summary.get("sessions") or []:
        iv = r.get("chunk_interval_s") or {}
        rows.append(
            (
                str(r["session"]),
                f"{r['frames']}/{r['requested_frames']}",
                f"{r['chunks']}/{r['expected_chunks']}",
                format_value(r.get("first_frame_s")),
                "/".join(format_value(iv.get(k)) for k in ("mean", "p50", "p95", "max")),
                format_value(r.get("session_fps"), 2),
                format_value(r.get("steady_fps"), 2),
                format_value(r.get("steady_compute_fps"), 2),
                "PASS" if r["passed"] else "FAIL",
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    for row in (head, *rows):
        print("   " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    for r in summary.get("sessions") or []:
        phases = r.get("steady_phase_mean_s") or {}
        compute = r.get("chunk_compute_s") or {}
        if phases or compute:
            print(
                f"   session {r['session']} steady chunk compute mean {format_value(compute.get('mean'))} s; phase means: "
                + (", ".join(f"{k} {v:.4f}" for k, v in phases.items()) or "none")
            )
    for r in summary.get("sessions") or []:
        controls = r.get("controls") or []
        if controls or r.get("controls_skipped"):
            latency = r.get("control_latency_ms") or {}
            print(
                f"   session {r['session']} controls: {len(controls)} sent, "
                f"{sum(c['confirmed'] for c in controls)} confirmed (control_state after p50 "
                f"{format_value(latency.get('p50'), 1)} ms, max {format_value(latency.get('max'), 1)} ms), "
                f"{len(r.get('controls_skipped') or [])} not sent"
            )
    sm = summary.get("service_metrics") or {}
    if sm:
        d = sm.get("deltas") or {}
        print(
            f"   metrics: chunk_compute mean {format_value(sm.get('chunk_compute_mean_s'))} s, encode "
            f"{format_value(sm.get('encode_per_chunk_s'), 4)} s/chunk, backpressure {format_value(sm.get('backpressure_s'))} s, "
            f"frames generated/sent/dropped {d.get('frames_generated_total', 0):g}/{d.get('frames_sent_total', 0):g}/"
            f"{d.get('frames_dropped_total', 0):g}"
        )
    agg = summary.get("aggregate") or {}
    if agg and agg.get("sessions", 0) > 1:
        print(
            f"   all sessions: {agg['frames']} frames in {agg['wall_s']} s, delivered {format_value(agg['delivered_fps'], 2)} FPS"
        )
    for w in summary.get("warnings") or []:
        print(f"   warning: {w}")
    print(f"   lossless verdict     {'PASSED' if summary.get('passed') else 'FAILED'}")
    for problem in summary.get("problems") or []:
        print(f"     - {problem}")
    print(f"   summary              {summary.get('output')}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.output = args.output if args.output.is_absolute() else Path.cwd() / args.output
    for name in ("no_proxy", "NO_PROXY"):  # urllib in runner.Service and any child: loopback never via a proxy
        os.environ[name] = ",".join(filter(None, (os.environ.get(name), "127.0.0.1,localhost")))

    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)  # still stop the service when we are terminated
    started = time.monotonic()
    summary: dict[str, Any] = {
        "tool": "tools/bench/stream_replay.py",
        "argv": sys.argv[1:] if argv is None else argv,
        "output": str(args.output),
        "service": {"started_here": not args.url},
        "problems": [],
        "warnings": [],
    }
    decoder = concurrent.futures.ThreadPoolExecutor(1, "decode")
    holder: dict[str, Any] = {"service": None, "decoder": decoder, "replays": []}
    try:
        asyncio.run(replay(args, summary, holder))
    except RunError as exc:
        summary["problems"].append(str(exc))
    except KeyboardInterrupt:
        summary["problems"].append("interrupted (Ctrl-C)")
    except SystemExit as exc:
        summary["problems"].append(f"terminated (exit {exc.code})")
    except Exception as exc:  # noqa: BLE001 - a bug here must still stop the service and say what happened
        summary["problems"].append(f"the replay failed: {type(exc).__name__}: {exc}")
    finally:
        decoder.shutdown(wait=False, cancel_futures=True)
        stop_service(args, summary, holder["service"])
    add_sessions(summary, holder)
    summary["wall_s"] = round(time.monotonic() - started, 3)
    if not summary.get("sessions") and not summary["problems"]:
        summary["problems"].append("no session ran")
    summary["passed"] = not summary["problems"]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.output, summary)
    print_table(summary)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
