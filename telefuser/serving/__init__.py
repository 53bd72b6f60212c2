"""The two services, each in its own folder over a common hall.

`stream/` is `telefuser serve-stream` (chunked world-model sessions over WebSocket/SSE, LingBot-World v2);
`video/` is `telefuser serve` (OpenAI-style batch text-to-video+audio jobs, MiniMax H3); `common/` holds what both
use: the launch and the leader/follower replay under torchrun, the local server, request bodies and errors, API keys,
limits and the memory budget, Prometheus text. Importing a package here imports neither FastAPI nor torch.
"""
