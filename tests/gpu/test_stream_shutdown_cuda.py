"""serve-stream with the real (tiny) LingBot-World v2 model on the GPU, 2 ranks: on a one-GPU host they share it and the
model's Ulysses exchange runs the CUDA-IPC copy engine (Symmetric Memory with a GPU per rank); one session streams,
then Ctrl-C must end both ranks cleanly with no CUDA IPC warning (handles are closed before the process groups go)."""

from __future__ import annotations

import re

import pytest
import torch

# the service's packages (fastapi and its pydantic): a GPU host without the serve extra skips here, with this reason
pytest.importorskip("fastapi", reason="serve-stream needs the serve extra: pip install -e '.[serve]'")

from tests.serve_stream_launch import stream_one_session_then_ctrl_c  # noqa: E402

pytestmark = pytest.mark.tf_kernel  # the model's exchange is expected on the copy engine

IPC_TROUBLE = re.compile(r"(?i)(warn|leak|error|fail).*ipc|ipc.*(warn|leak|error|fail)")


def test_serve_stream_on_gpu_ctrl_c_without_ipc_warnings():
    log, metadata = stream_one_session_then_ctrl_c(
        ["--config", "tiny", "--device", "cuda", "--resolution", "128x96"],
        frames=29,
        chunks=2,
        start_timeout_s=300,
        stream_timeout_s=300,
    )
    expected = "ce-symm" if torch.cuda.device_count() >= 2 else "ce-ipc"
    model = metadata["model"]  # the factory's metadata, as /v1/service/metadata nests it
    assert model["ulysses_transport"] == expected and model["warmup_s"] > 0, model
    assert "serve-stream exited cleanly" in log, log[-4000:]
    assert "rank 1: follower stopped after 4 model calls" in log, log[-4000:]  # create, 2 x next_chunk, close
    assert not [line for line in log.splitlines() if IPC_TROUBLE.search(line)], log[-4000:]
