"""`telefuser serve-stream`: chunked autoregressive world-model sessions (LingBot-World v2) over HTTP, WebSocket and
SSE, with a web page. `app.create_stream_app(factory)` builds the service for any model that offers `contract.py`'s
`SessionFactory`; `lingbot.py` is the real model's adapter, `fake.py` the test pattern. PROTOCOL.md is the wire
protocol."""
