"""The uvicorn server every service runs on, configured in one place: `telefuser serve`/`serve-stream` (`launch`) and
the background-thread server of tests and benchmarks (`local_server`) import it, and it imports neither."""

from __future__ import annotations

WS_MAX_BYTES = 64 << 10  # a larger client frame closes the connection (1009) before the app reads it
# No permessage-deflate: the server's WebSocket messages are JPEG/PNG frames, which deflate shrinks by 0.2% at tens
# of milliseconds of CPU a chunk on each side, all of it on the way from the model to the screen.
WS_DEFLATE = False


def server_for(app, **options):
    """A uvicorn server for `app` (`options`: uvicorn.Config's host, port, log_level, ...) with the services' WebSocket
    limits, a lifespan, a 5 s graceful shutdown, and the app's streams ended before its connections close."""
    import uvicorn

    config = uvicorn.Config(
        app,
        lifespan="on",
        timeout_graceful_shutdown=5,
        ws_max_size=WS_MAX_BYTES,
        ws_per_message_deflate=WS_DEFLATE,
        **options,
    )
    return make_server(config)


def make_server(config):
    """A uvicorn.Server that awaits the app's ``state.drain_on_shutdown()`` (where the app sets one: the stream
    service ends its sessions, closed events sent, before it closes connections).

    Without this, uvicorn's shutdown cuts WebSockets with 1012 and waits on open SSE responses until its timeout.
    """
    import uvicorn

    class StreamServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            drain = getattr(getattr(config.app, "state", None), "drain_on_shutdown", None)
            if drain is not None:
                await drain()
            await super().shutdown(sockets)

    return StreamServer(config)
