"""`telefuser serve-stream`: run the streaming service (rank 0) and, under torchrun, the follower ranks.

telefuser serve-stream --config tiny --device cpu               # --model lingbot_world_v2 (the default), tiny, CPU
telefuser serve-stream --fake --port 8088                       # the test-pattern model, no weights
telefuser serve-stream --fake --webrtc --delivery-mode realtime # the page streams over WebRTC, just in time
torchrun --nproc-per-node 4 -m telefuser.cli serve-stream ...   # rank 0 serves HTTP, ranks 1..3 follow
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from ...arg_types import canvas_size, int_in, non_negative_float, positive_float, positive_int
from ...models.registry import names
from ...runtime import add_runtime_args
from ..common.auth import keys_from_args
from ..common.http_errors import RequestError
from ..common.launch import add_server_args, run_command, run_service, serve_until_stopped
from ..common.limits import add_canvas_limit_args
from ..common.model_args import add_model_args, chosen_spec
from ..common.replica import replica_id
from ..common.startup import StartupError
from ..common.warmup import add_warmup_arg
from .contract import SessionFactory
from .envelope import CODECS
from .limits import StreamLimitFlags, check_stream_config
from .replay import FollowingFactory, follow
from .replica import ReplicaIdentity
from .webrtc.settings import CODECS as WEBRTC_CODECS
from .webrtc.settings import DEFAULT_MAX_BITRATE, WebRtcSettings, load_ice_servers, missing_dependency

log = logging.getLogger("telefuser.serving")
SERVICE = "stream"  # the adapter kind a model's spec names for this service: a `SessionFactory` builder
DEFAULT_MODEL = "lingbot_world_v2"


def build_fake_factory(args: argparse.Namespace) -> SessionFactory:
    from .fake import FakeSessionFactory

    defaults: dict[str, Any] = {}
    for key, value in (("resolution", args.resolution), ("num_frames", args.num_frames), ("fps", args.fps)):
        if value is not None:
            defaults[key] = value
    return FakeSessionFactory(
        delay_s=args.fake_delay, defaults=defaults, max_sessions=args.max_sessions or 4, pattern=args.fake_pattern
    )


class DefaultsShown(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def add_serve_stream_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve-stream",
        help="serve a streaming world model over HTTP/WebSocket/SSE (and WebRTC) with a web client at / "
        f"(models: {', '.join(names(SERVICE))})",
        description="Streaming service: rank 0 serves HTTP, other torchrun ranks follow its model calls.",
        formatter_class=DefaultsShown,
    )
    g = p.add_argument_group("service")
    add_server_args(g, port=8088)
    g.add_argument(
        "--max-sessions",
        type=positive_int,
        default=None,
        help="concurrent sessions (model KV slots); default: the factory's metadata max_sessions, else 1",
    )
    g.add_argument(
        "--buffer-chunks",
        type=positive_int,
        default=4,
        help="chunks a session may run ahead of what its viewer has played (the page never holds more), and the "
        "delivery queue's length",
    )
    g.add_argument(
        "--delivery-mode",
        choices=("lossless", "realtime"),
        default="lossless",
        help="lossless: every frame in order, a slow client slows generation, delivery acked (the AIPerf replay); "
        "realtime: each chunk starts just in time for the viewer's playout, with the keys held then (interactive)",
    )
    g.add_argument(
        "--codec", choices=CODECS, default="jpeg", help="the WebSocket envelope's frame codec when a create names none"
    )
    g.add_argument("--jpeg-quality", type=int_in(1, 95), default=85, help="JPEG quality of the envelope's frames, 1-95")
    g.add_argument(
        "--ack-timeout", type=positive_float, default=10.0, help="seconds to wait for the client's delivery_ack"
    )
    g.add_argument(
        "--idle-timeout",
        type=positive_float,
        default=120.0,
        help="seconds: close sessions nobody attaches to within this",
    )
    g.add_argument(
        "--max-body-mib", type=positive_float, default=32.0, help="largest create request (the image is in it)"
    )
    g.add_argument(
        "--replica-id",
        type=replica_id,
        default=None,
        help="this replica's name; session ids carry it (default: none, a single service)",
    )
    g.add_argument(
        "--public-url",
        default=None,
        help="the URL clients reach this replica at, for the create reply's URLs; {replica} is replaced by the "
        "replica id (behind the shipped HAProxy config: http://PROXY/r/{replica}); default: the address each "
        "request came in on",
    )
    w = p.add_argument_group("WebRTC", "video over WebRTC (aiortc), the web page's first choice when offered")
    w.add_argument("--webrtc", action="store_true", help="offer WebRTC delivery beside the WebSocket (needs aiortc)")
    w.add_argument("--webrtc-codec", choices=WEBRTC_CODECS, default="vp8", help="video codec, encoded with PyAV")
    w.add_argument(
        "--webrtc-max-bitrate-mbps",
        type=positive_float,
        default=DEFAULT_MAX_BITRATE / 1e6,
        help="the video encoder's bitrate cap, Mbit/s",
    )
    w.add_argument(
        "--webrtc-ice-servers",
        default=None,
        metavar="JSON_FILE",
        help="STUN/TURN servers for clients beyond the server's network, a JSON list of browser RTCIceServer "
        "objects ({urls, username, credential}); default: none (host candidates only; PROTOCOL.md, WebRTC)",
    )
    g.add_argument("--fake", action="store_true", help="serve the deterministic test-pattern model (no weights)")
    g.add_argument("--fake-delay", type=non_negative_float, default=0.25, help="--fake: seconds of 'compute' per chunk")
    g.add_argument(
        "--fake-pattern",
        choices=("scene", "noise"),
        default="scene",
        help="--fake: the start image panned by the keys, or incompressible noise (bitrate and bandwidth tests)",
    )
    lim = add_canvas_limit_args(p, "canvas")
    lim.add_argument(
        "--max-frames",
        type=positive_int,
        default=None,
        help="frames per session; open-ended sessions end there (default: 10 minutes at the model fps)",
    )
    lim.add_argument(
        "--max-session-memory-gib",
        type=positive_float,
        default=None,
        help="estimated memory one session may take (default: free device memory / max sessions)",
    )
    lim.add_argument(
        "--max-image-pixels",
        type=positive_int,
        default=None,
        help="uploaded image, checked before decoding (default: 40 megapixels)",
    )
    add_runtime_args(p, ulysses_default=None)  # every torchrun rank is a Ulysses rank unless told otherwise
    add_model_args(p, service=SERVICE, default=DEFAULT_MODEL)
    m = p.add_argument_group("sessions", "what a session that leaves them out gets")
    m.add_argument(
        "--resolution",
        type=canvas_size,
        default=None,
        help="WxH (default: the model's; LingBot-World v2 832x480, its tiny config 128x96)",
    )
    m.add_argument(
        "--num-frames", type=positive_int, default=None, help="frames per session (default: the model's, 77)"
    )
    m.add_argument("--fps", type=positive_float, default=None, help="target FPS (default: the model's, 16)")
    add_warmup_arg(m, what="a discarded session that runs every chunk shape")
    p.set_defaults(func=run_serve_stream)
    return p


def _replica(args: argparse.Namespace) -> ReplicaIdentity:
    try:
        return ReplicaIdentity(args.replica_id, args.public_url)
    except ValueError as exc:
        raise SystemExit(f"telefuser serve-stream: {exc}") from None


def _webrtc(args: argparse.Namespace) -> WebRtcSettings | None:
    if not args.webrtc:
        return None
    problem = missing_dependency()
    if problem:
        raise SystemExit(f"telefuser serve-stream: {problem}")
    try:
        servers = load_ice_servers(args.webrtc_ice_servers) if args.webrtc_ice_servers else ()
        return WebRtcSettings(args.webrtc_codec, round(args.webrtc_max_bitrate_mbps * 1e6), ice_servers=servers)
    except ValueError as exc:
        raise SystemExit(f"telefuser serve-stream: {exc}") from None


def run_serve_stream(args: argparse.Namespace) -> int:
    _replica(args)  # a bad --replica-id / --public-url ends the command before the model loads
    _webrtc(args)  # nor does a missing aiortc or a bad --webrtc-ice-servers file
    spec = chosen_spec(args, service=SERVICE, command="serve-stream")
    build = build_fake_factory if args.fake else spec.adapter_builder(SERVICE)
    return run_service(args, build, serve=lambda factory: _serve(args, factory), lead=FollowingFactory, follow=follow)


def _serve(args: argparse.Namespace, factory: SessionFactory) -> int:
    from .app import create_stream_app

    max_sessions = args.max_sessions or int(factory.metadata.get("max_sessions") or 1)
    limits = StreamLimitFlags.from_args(args)
    app = create_stream_app(
        factory,
        max_sessions=max_sessions,
        delivery_mode=args.delivery_mode,
        buffer_chunks=args.buffer_chunks,
        codec=args.codec,
        jpeg_quality=args.jpeg_quality,
        ack_timeout_s=args.ack_timeout,
        idle_timeout_s=args.idle_timeout,
        max_body_bytes=int(args.max_body_mib * 2**20),
        limits=limits,
        api_keys=keys_from_args(args),
        replica=_replica(args),
        models=names(SERVICE),
        webrtc=_webrtc(args),
    )
    check_session_defaults(app.state.service.registry)
    return serve_until_stopped(app, args, describe=f"model: {factory.metadata.get('model')}", command="serve-stream")


def check_session_defaults(registry) -> None:
    """A create that names no resolution, frames or fps must pass this service's limits: otherwise every such create
    would get a 422 for what the server was started with."""
    try:
        check_stream_config(registry.limits, registry.effective_config({}))
    except (ValueError, RequestError) as exc:
        detail = exc.detail if isinstance(exc, RequestError) else str(exc)
        raise StartupError(
            f"a session that leaves resolution, num_frames and fps out would be refused: {detail}; change "
            "--resolution, --num-frames or --fps, or the limit named"
        ) from None


def main(argv: list[str] | None = None) -> int:
    return run_command(add_serve_stream_parser, "python -m telefuser.serving.stream.cli", argv)


if __name__ == "__main__":
    sys.exit(main())
