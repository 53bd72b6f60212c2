"""Out of memory under torchrun, on 2 gloo ranks: rank 0 serves, rank 1 replays (common/replay.py).

The replay protocol does not agree failures across ranks; rank 0 decides what the client sees (serving/README.md,
"A rank that runs out of memory"). These tests pin down what that gives with fake models, which make no collectives
of their own: a job that runs out of memory on rank 0 (alone or with the follower) fails `out_of_memory` there and
the follower leaves it at the same message; one that runs out only on the follower goes on on rank 0; a stream
session rank 0 cannot make is closed on the follower too. Either way both ranks run the next job together.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

OOM = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.05 GiB is free."
TOO_BIG = "too big"


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def _video_runner(rank: int, oom_ranks: tuple[int, ...]):
    from telefuser.pipelines.hooks import StepHooks
    from telefuser.serving.video.fake import FakeVideoRunner

    class OomRunner(FakeVideoRunner):
        """Runs out of memory at the second denoising step of the TOO_BIG job, on the ranks in `oom_ranks`."""

        def run(self, job_request, output, hooks):
            if job_request.prompt != TOO_BIG or rank not in oom_ranks:
                return super().run(job_request, output, hooks)

            def cancelled() -> bool:
                if self.steps_run[-1] >= 1:
                    raise torch.OutOfMemoryError(OOM)
                return hooks.cancelled()

            return super().run(job_request, output, StepHooks(progress=hooks.progress, cancelled=cancelled))

    return OomRunner(step_delay_s=0.01)


def _serve_two_jobs(ctx, oom_ranks):
    import tempfile

    from fastapi.testclient import TestClient

    from telefuser.serving.video.app import create_video_app
    from telefuser.serving.video.replay import FollowingRunner, follow_runner

    fake = _video_runner(ctx.rank, oom_ranks)
    group = dist.new_group(backend="gloo")
    if ctx.rank != 0:
        return fake.calls, fake.steps_run, follow_runner(fake, group), None
    leader = FollowingRunner(fake, group, heartbeat_s=30)
    try:
        with tempfile.TemporaryDirectory() as out, TestClient(create_video_app(leader, output_dir=out)) as client:
            ids = [client.post("/v1/videos", json={"prompt": p, "steps": 6}).json()["id"] for p in (TOO_BIG, "fits")]
            for vid in ids:
                _wait(lambda vid=vid: client.get(f"/v1/videos/{vid}").json()["status"] in ("completed", "failed"))
            jobs = [client.get(f"/v1/videos/{vid}").json() for vid in ids]
    finally:
        leader.shutdown()
    return fake.calls, fake.steps_run, None, [(job["status"], job["error"]) for job in jobs]


@pytest.mark.parametrize("oom_ranks", [(0,), (0, 1)], ids=["rank0", "both"])
def test_a_job_out_of_memory_on_rank0_fails_on_every_rank_and_the_next_runs(ranks2, oom_ranks):
    (calls0, steps0, _, jobs), (calls1, steps1, followed, _) = ranks2.run(_serve_two_jobs, oom_ranks)
    (status, error), (next_status, _) = jobs
    assert status == "failed" and error["code"] == "out_of_memory" and OOM in error["message"], error
    assert next_status == "completed"
    assert calls0 == calls1 and [c["prompt"] for c in calls1] == [TOO_BIG, "fits"]
    # Both ranks left the job after its first step (the follower when rank 0 sent the job's close instead of the
    # next step's cancel answer) and ran every step of the next one.
    assert steps0 == steps1 == [1, 5]
    assert followed == 6  # make, run, close of each job: the failed job's close was not lost


def test_a_job_out_of_memory_on_a_follower_alone_goes_on_on_rank0(ranks2):
    """What the protocol gives, not what a sharded model would do: here rank 0 needs nothing from the follower and
    completes the job; a real model would wait for the follower at its next collective (serving/README.md)."""
    (calls0, steps0, _, jobs), (calls1, steps1, followed, _) = ranks2.run(_serve_two_jobs, (1,))
    assert [status for status, _ in jobs] == ["completed", "completed"]
    assert calls0 == calls1 and steps0 == [5, 5] and steps1 == [1, 5]  # the follower skipped the job's later steps
    assert followed == 6  # and followed the next job in step


def _create_out_of_memory(ctx):
    from telefuser.serving.stream.fake import FakeSessionFactory
    from telefuser.serving.stream.replay import FollowingFactory, follow

    class OomOnRank0(FakeSessionFactory):
        def create(self, image, prompt, config):
            if prompt == TOO_BIG and ctx.rank == 0:
                raise torch.OutOfMemoryError(OOM)
            return super().create(image, prompt, config)

    fake = OomOnRank0(defaults={"resolution": "32x32", "num_frames": 29})
    group = dist.new_group(backend="gloo")
    if ctx.rank != 0:
        followed = follow(fake, group)
        return [c[0] for c in fake.calls], fake.open_sessions, followed
    image = np.full((8, 8, 3), 7, np.uint8)
    leader = FollowingFactory(fake, group, heartbeat_s=30)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            leader.create(image, TOO_BIG, dict(fake.defaults))
        session = leader.create(image, "fits", dict(fake.defaults))
        session.next_chunk([])
        session.close()
    finally:
        leader.shutdown()
    return [c[0] for c in fake.calls], fake.open_sessions, None


def test_a_session_rank0_cannot_make_is_closed_on_the_follower(ranks2):
    (calls0, open0, _), (calls1, open1, followed) = ranks2.run(_create_out_of_memory)
    assert calls0 == ["create", "next_chunk", "close"]
    assert calls1 == ["create", "close", "create", "next_chunk", "close"]  # its copy of the failed one was freed
    assert open0 == open1 == 0 and followed == 5
