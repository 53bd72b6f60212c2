r"""Stream drive: a direct benchmark of `telefuser serve-stream` that drives LingBot-World v2 sessions through the real
client protocol (HTTP create, then the session's WebSocket, as the web page does), with the lossless checks, and no AIPerf.

    python -m tools.bench.stream_drive --config official                     # the 1-minute session (GPU, CUDA)
    python -m tools.bench.stream_drive --config tiny --device cpu --resolution 64x48 \
        --bench-config tools/aiperf/configs/stream_lingbot_world_v2_ci.yaml  # the 3-chunk CI session on a CPU
    python -m tools.bench.stream_drive --url http://127.0.0.1:8088 --chunks 5   # a service that is running
    python -m tools.bench.stream_drive --config official -- --max-frames 2000   # after --: verbatim service flags

Steps: start `python -m telefuser.cli serve-stream` (its own process group, a free loopback port, lossless
delivery; torchrun when --nproc > 1), or use --url -> wait for /v1/service/health -> read /v1/service/metadata ->
scrape /v1/service/metrics -> run --sessions sessions, --concurrency at a time -> scrape the metrics again -> stop the
service (SIGINT to its group, then SIGTERM, then SIGKILL) -> print the table, write the JSON (--output).

The session plan is the AIPerf bench config's (--bench-config, default the one-minute session: 957 frames = 60 chunks,
16 FPS, seed 42, frame_policy strict, the controls of tools/aiperf/data/stream_controls_1min.json, the prompt and start
frame of its dataset), so both benchmarks drive the same session; --num-frames/--chunks, --controls, --prompt,
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

Modules: cli (arguments, the run), plan (the session plan), service (start or attach, metrics), driver (one session
over the WebSocket), envelopes (chunk envelope + chunk_sent pairing), frames (decoding off the event loop), report
(verdict and numbers per session), table (what is printed), progress. The session state machine, the lossless checks
and the control clock are the AIPerf plugin's (tools/aiperf/telefuser_aiperf), so both benchmarks judge alike.
"""
