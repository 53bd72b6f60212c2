"""The video service under torchrun: rank 0's jobs run on every rank, and a cancel is one decision for all.

`FollowingRunner` is rank 0's `VideoRunner`, `follow_runner(runner, group)` a follower's loop: a job is the object
"job" made with its job request over common/replay.py, `run()` its replayed call (a follower writes nothing), and every
`hooks.cancelled()` answer is shared from rank 0 so all ranks leave the loop at the same step (serving/README.md).
A job's media travel in the make message beside its request (the followers never read the artifact store), and every
rank merges the job's LoRAs from its own --lora-dir, in the same order of jobs.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from telefuser.pipelines.hooks import StepHooks

from ..common.replay import Follower, Leader
from .contract import JobCancelled, RunOutcome, VideoShape, VideoRunner, JobRequest

log = logging.getLogger("telefuser.serving")


class _Job:
    """One generation on one rank."""

    def __init__(self, runner: VideoRunner, job_request: JobRequest, output: Path | None, hooks: StepHooks):
        self._runner, self._job_request, self._output, self._hooks = runner, job_request, output, hooks

    def run(self) -> RunOutcome | None:
        return self._runner.run(self._job_request, self._output, self._hooks)

    def close(self) -> None:
        return None  # nothing to free: the runner owns the model, and run() has written the clip


class _FollowerJob(_Job):
    def run(self) -> RunOutcome | None:
        try:
            return super().run()
        except JobCancelled as exc:  # rank 0 cancelled it: expected, not a follower error
            log.info("follower: job cancelled after %d step(s)", exc.step)
            return None


class FollowingRunner:
    """Rank 0's runner: every `run` is first replayed on the followers, then run here; `shutdown()` stops them."""

    def __init__(self, runner: VideoRunner, group, *, heartbeat_s: float = 60.0):
        self._runner = runner
        self._leader = Leader(group, heartbeat_s=heartbeat_s)
        self.model, self.metadata = runner.model, runner.metadata
        self.loras = getattr(runner, "loras", None)  # the --lora-dir names /v1/service/metadata lists
        if callable(getattr(runner, "memory_estimate", None)):  # arithmetic on rank 0 only: nothing is broadcast
            self.memory_estimate = runner.memory_estimate

    @property
    def pings(self) -> int:
        return self._leader.pings

    def plan(self, job_request: JobRequest) -> VideoShape:
        return self._runner.plan(job_request)

    def run(self, job_request: JobRequest, output: Path | None, hooks: StepHooks) -> RunOutcome:
        self._runner.plan(job_request)  # raises here, before any follower hears of the job
        # the caller's hooks (its progress and stage reports) with the cancel answer shared by every rank
        shared = dataclasses.replace(hooks, cancelled=lambda: self._leader.share(bool(hooks.cancelled())))
        job = self._leader.make(
            "job",
            job_request.as_dict(),
            job_request.media_data(),
            local=lambda: _Job(self._runner, job_request, output, shared),
        )
        try:
            return job.call("run")
        finally:
            job.close()

    def close(self) -> None:
        self._runner.close()

    def shutdown(self) -> None:
        self._leader.shutdown()


def follow_runner(runner: VideoRunner, group) -> int:
    """A follower rank: run rank 0's jobs on `runner` until it stops; returns the number of calls."""
    follower = Follower(group)

    def job(job_request: dict, media: list[bytes]) -> _FollowerJob:
        received = JobRequest.from_dict(job_request).with_media_data(media)
        return _FollowerJob(runner, received, None, StepHooks(cancelled=lambda: bool(follower.receive())))

    return follower.follow({"job": job})
