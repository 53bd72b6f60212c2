"""What `serve` and `serve-stream` share: one HTTP server until a signal, and the torchrun control plane.

Rank 0 runs the app on a socket it binds itself (so `--port 0` works and the log names the real port); Ctrl-C and
SIGTERM both end it gracefully. Under torchrun the other ranks follow rank 0's model calls over a CPU (gloo) group
and leave only when rank 0 broadcasts stop, never in the middle of a collective.
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Callable

log = logging.getLogger("telefuser.serving")


def _raise_system_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


def serve_until_stopped(app, *, host: str, port: int, log_level: str, describe: str) -> None:
    """Serve `app` on host:port until Ctrl-C or SIGTERM, then shut down gracefully. `describe` ends the log line."""
    import uvicorn

    from .local_server import make_server

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                            lifespan="on")
    server = make_server(config)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(config.backlog)  # connections queue from now on, so the logged URL is usable at once
        shown = f"[{host}]" if ":" in host else host
        log.info("serving on http://%s:%d (%s)", shown, sock.getsockname()[1], describe)
        # uvicorn re-raises the captured signal after its graceful shutdown; make SIGTERM an exception, as SIGINT
        # is, so that the caller still runs its cleanup (the followers' stop).
        signal.signal(signal.SIGTERM, _raise_system_exit)
        try:
            server.run(sockets=[sock])
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            sock.close()
    finally:
        signal.signal(signal.SIGTERM, previous)


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
