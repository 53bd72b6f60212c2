"""What `serve` and `serve-stream` share: the service flags, one HTTP server until a signal, and under torchrun the
split into rank 0 (serving) and followers (replaying its model calls; replay.py).

Before a model is built, the start-up checks run (startup.py: the device, the port, the attention package), and a
builder's error that is the user's to fix (a bad checkpoint or configuration) ends in one line with exit status 2.

Rank 0 binds its own socket (so `--port 0` works and the log names the real port), caps WebSocket frames, hides
`token=` in access logs, warns about a keyless bind beyond loopback and ends gracefully on SIGINT or SIGTERM;
followers leave only when rank 0 broadcasts stop, never in the middle of a collective.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from ...arg_types import port as port_number
from .auth import add_auth_args, keys_from_args
from .cli_help import OneLineErrorParser
from .startup import StartupError, bind_failure, check_attention, check_device, check_port, explain_build_error, run_cli

log = logging.getLogger("telefuser.serving")


def add_server_args(group, *, port: int) -> None:
    """--host, --port, --log-level and the API keys, the same for both services."""
    group.add_argument(
        "--host",
        default="127.0.0.1",
        help="127.0.0.1 (default) serves this machine only; see the README before exposing a service",
    )
    group.add_argument(
        "--port", type=port_number, default=port, help="the port to listen on; 0 picks a free one (logged)"
    )
    group.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"), help="log verbosity"
    )
    add_auth_args(group)


def run_service(
    args: argparse.Namespace,
    build: Callable[[argparse.Namespace], Any],
    *,
    serve: Callable[[Any], int],
    lead: Callable[[Any, Any], Any],
    follow: Callable[[Any, Any], int],
    close_model: bool = False,
) -> int:
    """Build the model on this rank and serve it. Under torchrun rank 0 serves `lead(model, group)` (which replays
    each model call on the followers and has `shutdown()`), and the other ranks run `follow(model, group)`."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    keys_from_args(args)  # a malformed key fails now, not after the model is loaded
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    check_before_build(args, serving=rank == 0)
    model = build_or_explain(build, args)
    try:
        if world == 1:
            return serve(model)
        group = control_group()
        if rank != 0:
            follow_until_stopped(follow, model, group, rank)
            return 0
        leader = lead(model, group)
        try:
            return serve(leader)
        finally:
            leader.shutdown()  # also when binding failed: the followers must not wait forever
    finally:
        if close_model:
            model.close()


def check_before_build(args: argparse.Namespace, *, serving: bool) -> None:
    """The start-up checks that need no model: the device and the attention package (not for a fake model, which
    uses neither), and on the serving rank the port."""
    if not getattr(args, "fake", False):
        check_device(getattr(args, "device", None))
        check_attention(getattr(args, "attn_impl", None))
    if serving:
        check_port(args.host, args.port)


def build_or_explain(build: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> Any:
    """`build(args)`; an error that is a start-up mistake (startup.explain_build_error) becomes one line."""
    try:
        return build(args)
    except SystemExit:
        raise
    except Exception as exc:
        mistake = explain_build_error(exc)
        if mistake is None:
            raise
        raise mistake from None


def run_command(add_parser: Callable[[Any], Any], prog: str, argv: list[str] | None = None) -> int:
    """`python -m` a service's cli: parse its one subcommand and run it (a start-up mistake: one line, status 2)."""
    parser = OneLineErrorParser(prog=prog)
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return run_cli(args.func, args, args.command)


def serve_until_stopped(app, args: argparse.Namespace, *, describe: str, command: str) -> int:
    """Serve `app` on --host:--port until Ctrl-C or SIGTERM, then shut down gracefully; `describe` ends the log line
    that names the URL, `command` the one that says it exited."""
    _serve_socket(app, host=args.host, port=args.port, log_level=args.log_level, describe=describe)
    log.info("%s exited cleanly", command)
    return 0


def _serve_socket(app, *, host: str, port: int, log_level: str, describe: str) -> None:
    from .auth import RedactTokens
    from .uvicorn_server import server_for

    server = server_for(app, host=host, port=port, log_level=log_level)
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(RedactTokens())
    keys = getattr(getattr(app, "state", None), "api_keys", None)
    if not _loopback(host) and not (keys is not None and keys.enabled):
        log.warning(
            "listening on %s without an API key: anyone who can reach this port can queue work; set "
            "TELEFUSER_API_KEY (or --api-key) and put TLS in front (see the README)",
            host,
        )
    previous = signal.getsignal(signal.SIGTERM)
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:  # taken since the early check (startup.check_port)
            sock.close()
            raise StartupError(bind_failure(host, port, exc)) from None
        sock.listen(server.config.backlog)  # connections queue from now on, so the logged URL is usable at once
        shown = f"[{host}]" if ":" in host else host
        log.info("serving on http://%s:%d (%s)", shown, sock.getsockname()[1], describe)
        # SIGTERM asks the server to stop: before uvicorn installs its own handlers (a signal right after the line
        # above) it finds should_exit set and shuts down gracefully once started; after its graceful shutdown uvicorn
        # re-raises the signal it captured, which must not kill the process, so the caller still runs its cleanup
        # (the followers' stop). Raising from the handler instead could interrupt asyncio.run half-way.
        signal.signal(signal.SIGTERM, lambda signum, frame: setattr(server, "should_exit", True))
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            pass
        finally:
            sock.close()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def control_group():
    """A gloo group beside whatever the model uses: the leader's calls reach the followers through it."""
    import torch.distributed as dist

    if not dist.is_initialized():  # the model builder has normally done it (init_distributed)
        dist.init_process_group("gloo")
    return dist.new_group(backend="gloo")


def follow_until_stopped(follow: Callable[[object, object], int], model, group, rank: int) -> int:
    """Run a follower rank: replay rank 0's model calls until it broadcasts stop; returns the number of calls.

    A terminal Ctrl-C reaches every rank, and torchrun's agent then sends SIGTERM to all workers; followers ignore
    both and leave when rank 0 (which shuts down in order) says so. If rank 0 dies instead, the broadcast fails and
    the follower exits with that error."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    calls = follow(model, group)
    log.info("rank %d: follower stopped after %d model calls", rank, calls)
    return calls
