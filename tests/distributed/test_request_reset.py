"""A request after one that failed on the copy engine runs on the copy engine again: the pipelines reset the DiT's
Ulysses transport at every request boundary, on every rank (2 gloo ranks, the tiny LingBot DiT under Ulysses2 over
the host-shared-memory copy engine, one agreed setup failure injected into session 1 after its first group began)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from telefuser.distributed.ulysses import UlyssesTransportError
from tools.harness.transport_cases import Q_TARGET_CALL, _failing_comm


def _two_sessions(ctx):
    from telefuser.distributed.mesh import ParallelConfig, build_mesh
    from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
    from telefuser.pipelines.lingbot_world_v2 import build_lingbot_pipeline
    from telefuser.runtime import Runtime

    mesh = build_mesh(ParallelConfig(ulysses_degree=2))
    pipe = build_lingbot_pipeline(config="tiny", runtime=Runtime(mesh, torch.device("cpu"), torch.float32), seed=0)
    failing = lambda group: _failing_comm(ctx, "host-shm", Q_TARGET_CALL)
    LINGBOT_WORLD_V2.parallelize(pipe.dit, mesh, communicator_factory=failing)
    rgb = np.full((32, 32, 3), 100, np.uint8)
    try:
        first = pipe.start(rgb, "a road", seed=1, resolution=(32, 32), num_frames=13)
        try:
            first.next_chunk()
            failed = None
        except UlyssesTransportError as exc:
            failed = str(exc)
        refused_on = pipe.dit.communicator.backend_name
        with pipe.start(rgb, "a road", seed=1, resolution=(32, 32), num_frames=13) as second:
            frames = second.next_chunk().frames
        return failed, first.closed, refused_on, pipe.dit.communicator.backend_name, frames
    finally:
        pipe.close()


@pytest.mark.timeout(120)
def test_session_two_runs_on_the_copy_engine_after_session_one_failed_there(ranks2):
    results = ranks2.run(_two_sessions)
    for failed, first_closed, refused_on, second_on, frames in results:
        assert failed is not None and "injected failure" in failed  # the same agreed error on every rank
        assert first_closed and refused_on == "host-shm"
        assert second_on == "host-shm"  # not the portable fallback: reset() reopened the copy engine
        assert frames.shape == (13, 32, 32, 3)
    assert np.array_equal(results[0][4], results[1][4])  # every rank holds the same frames
