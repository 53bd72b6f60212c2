"""TeleFuser plugins for AIPerf 0.13.0 (endpoint + transport `telefuser_stream`) and the pure helpers around them.

aiperf-free modules (importable from the engine's venv, used by the runners and unit tests):
    sse       incremental SSE parser with per-event arrival timestamps
    lossless  the lossless-delivery checks of one session
    controls  timed control traces
    session   request options and the client-side state machine of one session
    summary   steady compute FPS, client FPS, percentiles
    artifacts post-run checks over AIPerf's artifact directory and the service's Prometheus metrics
aiperf glue (only in .venv-aiperf): endpoint, transport; registered by plugins.yaml.
"""

__version__ = "0.1.0"
