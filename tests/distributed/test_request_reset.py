"""A request after one that failed on the copy engine runs on the copy engine again: the pipelines reset the DiT's
Ulysses transport at every request boundary, on every rank (2 gloo ranks under Ulysses2 over the host-shared-memory
copy engine, one agreed setup failure injected into request 1 after its first group began): the tiny LingBot DiT,
and Wan 2.2 T2V-A14B, whose two experts share one communicator."""

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
        refused_on = pipe.dit.communicator.transport
        with pipe.start(rgb, "a road", seed=1, resolution=(32, 32), num_frames=13) as second:
            frames = second.next_chunk().frames
        return failed, first.closed, refused_on, pipe.dit.communicator.transport, frames
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


def _two_wan_requests(ctx):
    from telefuser.distributed.mesh import ParallelConfig, build_mesh
    from telefuser.models.wan2_2.spec import WAN22_T2V_A14B
    from telefuser.pipelines.wan2_2.loading import build_wan22_pipeline
    from telefuser.runtime import Runtime

    mesh = build_mesh(ParallelConfig(ulysses_degree=2))
    pipe = build_wan22_pipeline(
        variant="t2v-a14b", config="tiny", runtime=Runtime(mesh, torch.device("cpu"), torch.float32)
    )
    failing = _failing_comm(ctx, "host-shm", Q_TARGET_CALL)
    for expert in pipe.experts:  # both experts share one communicator, as the loader gives them
        WAN22_T2V_A14B.parallelize(expert, mesh, communicator_factory=lambda group: failing)
    try:
        try:
            pipe("a red fox", seed=1, steps=2)
            failed = None
        except UlyssesTransportError as exc:
            failed = str(exc)
        refused_on = failing.transport
        video = pipe("a red fox", seed=1, steps=2)
        return failed, refused_on, failing.transport, video.frames
    finally:
        failing.close()


@pytest.mark.timeout(120)
def test_a_wan_request_runs_on_the_copy_engine_after_the_one_before_failed_there(ranks2):
    results = ranks2.run(_two_wan_requests)
    for failed, refused_on, second_on, frames in results:
        assert failed is not None and "injected failure" in failed  # the same agreed error on every rank
        assert refused_on == "host-shm"
        assert second_on == "host-shm"  # reset() at the request boundary reopened the copy engine for both experts
        assert frames.ndim == 4 and frames.shape[-1] == 3 and frames.std() > 0
    assert np.array_equal(results[0][3], results[1][3])
