"""Control-to-display latency of `telefuser serve-stream`, measured the way a viewer sees it (issue 35).

    python -m tools.bench.stream_latency --fake --transports websocket,webrtc      # headless Chromium, side by side
    python -m tools.bench.stream_latency --config tiny --device cpu               # the tiny LingBot-World v2 on CPU
    python -m tools.bench.stream_latency.client --url http://HOST:8088 --presses 10   # Python client (GPU host)

Both print one row per run: key->screen p50/p95 (a control sent -> the first frame computed under it drawn), the
same in chunk intervals, the chunk interval, the transport overhead p50/p95 (per chunk: the model's output ready on
the server -> its first frame drawable, playout buffering and WebRTC pacing excluded), displayed FPS and stalls, the
model's generation FPS, the most frames the client held against the announced buffer, and media Mbit/s. Modules: cli
(the browser bench), client (the Python client), browser (the page driver, shared with the tests), playout and
measure (the page's playout and measurements in Python), service (start serve-stream or use --url), table.
"""
