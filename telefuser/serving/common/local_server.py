"""Run an ASGI app with uvicorn in a background thread on a free loopback port (tests, benchmarks, notebooks)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator


def make_server(config):
    """A uvicorn.Server that ends the app's streams (closed events, sessions freed) before it closes connections.

    Without this, uvicorn's shutdown cuts WebSockets with 1012 and waits on open SSE responses until its timeout.
    """
    import uvicorn

    class StreamServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            registry = getattr(getattr(config.app, "state", None), "stream", None)
            if registry is not None:
                await registry.drain_for_shutdown()
            await super().shutdown(sockets)

    return StreamServer(config)


@contextlib.contextmanager
def serve_in_thread(app, *, host: str = "127.0.0.1", startup_timeout_s: float = 20.0) -> Iterator[str]:
    """Yield the base URL ("http://127.0.0.1:PORT") while the server runs; stop it (lifespan included) on exit."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))  # the kernel picks the port and we keep the socket: no race with other tests
    port = sock.getsockname()[1]
    from .launch import WS_DEFLATE, WS_MAX_BYTES

    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
        ws_max_size=WS_MAX_BYTES,
        ws_per_message_deflate=WS_DEFLATE,
    )
    server = make_server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
