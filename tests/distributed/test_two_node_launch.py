"""The engine launched as torchrun launches it over two nodes: two agents (`--nnodes=2`, one process each) meeting at a
c10d rendezvous on loopback. Each process is then LOCAL_RANK 0 of a one-process node, which is what breaks code that
takes the local rank for the global one (two writers of one MP4, two rank 0s).

The LingBot-World v2 session under Ulysses2 must write the same frames as the same session from one agent with two
processes: the same kernels on the same shards, so the decoded frames are compared exactly."""

from __future__ import annotations

import json

import av
import numpy as np

from tests.torchrun_launch import finish, run_torchrun, start_torchrun
from tools.harness.service_servers import free_port

SESSION = ["examples/lingbot_world_v2/run_i2v.py", "--config", "tiny", "--device", "cpu", "--ulysses-degree", "2"]
TIMEOUT_S = 240


def _frames(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _two_agents(output) -> list[tuple[int, str]]:
    """Node 0 and node 1, each an agent of one process, started together; (exit status, output) of each."""
    rendezvous = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    agents = [
        start_torchrun(
            [*rendezvous, f"--node-rank={node}", "--rdzv-id=two-node-test"], *SESSION, "--output", str(output)
        )
        for node in (0, 1)
    ]
    return finish(agents, TIMEOUT_S)


def test_a_session_over_two_nodes_writes_the_frames_of_one_node(tmp_path):
    one_node = tmp_path / "one_node.mp4"
    rc, out = run_torchrun(2, *SESSION, "--output", str(one_node), timeout=TIMEOUT_S)
    assert rc == 0, out[-3000:]
    two_nodes = tmp_path / "two_nodes.mp4"
    results = _two_agents(two_nodes)
    for node, (rc, out) in enumerate(results):
        assert rc == 0, f"node {node}:\n{out[-3000:]}"
    assert sum(f"wrote {two_nodes}" in out for _, out in results) == 1  # global rank 0 alone writes
    metrics = json.loads(two_nodes.with_suffix(".json").read_text())
    assert metrics["launch"]["world_size"] == 2 and metrics["launch"]["ulysses_degree"] == 2
    expected, got = _frames(one_node), _frames(two_nodes)
    assert got.shape == expected.shape == (77, 96, 128, 3)
    assert np.array_equal(got, expected)
    assert got.std() > 0  # real frames, not a blank clip
