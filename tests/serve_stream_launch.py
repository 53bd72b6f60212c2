"""Start `telefuser serve-stream` under torchrun (rank 0 serves, rank 1 follows), stream one session over SSE, acknowledge it,
then press Ctrl-C the way a terminal does (SIGINT to the whole process group). Shared by the CPU and GPU tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ONE_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


def stream_one_session_then_ctrl_c(
    args: list[str], *, frames: int, chunks: int, start_timeout_s: float = 60, stream_timeout_s: float = 60
) -> tuple[str, dict]:
    """Returns (the whole log of both ranks, the service metadata). Asserts the session's chunks and frames."""
    import httpx

    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.Popen(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "telefuser.cli",
            "serve-stream",
            "--port",
            "0",
            "--num-frames",
            str(frames),
            *args,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    serving = re.compile(r"serving on (http://127\.0\.0\.1:\d+)")
    try:
        deadline = time.monotonic() + start_timeout_s
        while not serving.search("".join(output)):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(output)
            time.sleep(0.05)
        base = serving.search("".join(output)).group(1)
        with httpx.Client(base_url=base, trust_env=False, timeout=stream_timeout_s) as http:
            metadata = http.get("/v1/service/metadata").json()
            s = http.post("/v1/stream/sessions", json={"prompt": "p", "image": ONE_PIXEL_PNG}).json()
            with http.stream("GET", s["sse_path"]) as r:
                events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
            assert [e["chunk"] for e in events if e["type"] == "chunk"] == list(range(chunks)), events
            assert events[-1]["type"] == "done" and events[-1]["published_frames"] == frames, events[-1]
            ack = http.post(s["sse_path"].replace("/events", "/ack"), json={"published_frames": frames}).json()
            assert ack["match"], ack
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    return "".join(output), metadata
