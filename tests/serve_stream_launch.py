"""Start `telefuser serve-stream` under torchrun (rank 0 serves, rank 1 follows), stream one session over SSE, acknowledge it,
then press Ctrl-C the way a terminal does (SIGINT to the whole process group). Shared by the CPU and GPU tests."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from tools.harness.server_process import ServerProcess

ONE_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


def stream_one_session_then_ctrl_c(
    args: list[str], *, frames: int, chunks: int, start_timeout_s: float = 60, stream_timeout_s: float = 60
) -> tuple[str, dict]:
    """Returns (the whole log of both ranks, the service metadata). Asserts the session's chunks and frames."""
    import httpx

    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "telefuser.cli", "serve-stream", "--port",
               "0", "--num-frames", str(frames), *args]  # fmt: skip
    with ServerProcess(command) as server:
        base = server.wait_url(start_timeout_s)
        with httpx.Client(base_url=base, trust_env=False, timeout=stream_timeout_s) as http:
            metadata = http.get("/v1/service/metadata").json()
            s = http.post("/v1/stream/sessions", json={"prompt": "p", "image": ONE_PIXEL_PNG}).json()
            with http.stream("GET", s["sse_path"]) as r:
                events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
            assert [e["chunk"] for e in events if e["type"] == "chunk"] == list(range(chunks)), events
            assert events[-1]["type"] == "done" and events[-1]["published_frames"] == frames, events[-1]
            ack = http.post(s["sse_path"].replace("/events", "/ack"), json={"published_frames": frames}).json()
            assert ack["match"], ack
        server.stop(signal.SIGINT, 60)
    return server.log, metadata
