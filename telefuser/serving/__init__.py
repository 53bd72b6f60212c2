"""Streaming service for chunked autoregressive world models (LingBot-World v2).

`create_stream_app(factory, ...)` builds the FastAPI app; a factory implements `protocol.SessionFactory`;
`fake.FakeSessionFactory` is the test/demo model; `followers` lets rank 0 drive a multi-rank model;
`stream_cli.add_serve_stream_parser` adds the `serve-stream` command. Importing this package does not import
FastAPI or torch; the submodules do.
"""

from .protocol import ALLOWED_KEYS, CONFIG_KEYS, Chunk, SessionFactory, StreamSession

__all__ = ["ALLOWED_KEYS", "CONFIG_KEYS", "Chunk", "SessionFactory", "StreamSession"]
