"""Run an ASGI app with uvicorn in a background thread on a free loopback port (tests, benchmarks, notebooks)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from .uvicorn_server import server_for


@contextlib.contextmanager
def serve_in_thread(app, *, host: str = "127.0.0.1", startup_timeout_s: float = 20.0) -> Iterator[str]:
    """Yield the base URL ("http://127.0.0.1:PORT") while the server runs; stop it (lifespan included) on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))  # the kernel picks the port and we keep the socket: no race with other tests
    port = sock.getsockname()[1]
    server = server_for(app, log_level="warning")
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
