"""The video service's worker: one thread claims the oldest queued job from the job store, runs it, records how it
ended; between jobs it lets the store sweep (expired leases, jobs past their retention).

One GPU group computes one clip at a time, so one thread calls `runner.run` while the event loop only submits,
cancels, deletes and reads (serving/README.md). While a job runs, each progress write renews its lease and brings
back a client's cancel (and a `LeaseKeeper` renews it through long phases without steps, such as the decode); the
runner stops at its next denoising step once `claim.stop` is set. A database that cannot be reached never ends the
thread: the worker retries with backoff, and what it could not record is left to the lease (the job runs again).
A job that runs out of device memory fails alone (`out_of_memory`, saying what ran out and what to change); the
allocator's cache is freed and the next job runs. A job's media (keyframes, references) are read back from the
artifact store before it runs, checked against the sha256 recorded at submission, and removed once it has ended for
good (a job handed back or whose lease was lost keeps them: it runs again). Each job logs one line when it starts
and one when it ends (job_log.py), and its video object says which stage it is in: "starting" (text encoding, inputs,
LoRAs) until the first denoising step, "denoising", "decoding" after the last step, "muxing" (the runner reports it)
and "publishing" (the MP4 moved or uploaded to the artifact store).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..common.out_of_memory import (
    VIDEO_ADVICE,
    free_cached_memory,
    is_out_of_memory,
    out_of_memory_message,
    what_ran_out,
)
from ..common.request_body import encodable_text
from .contract import JobCancelled, JobHooks, RunOutcome, VideoRunner, JobRequest
from .job_log import StageClock, ended_line, started_line
from .metrics import VideoMetrics
from .store.base import ArtifactStore, Claim, Ending, JobStore, MissingArtifact, StoreUnavailable

log = logging.getLogger("telefuser.serving")
T = TypeVar("T")
MAX_BACKOFF_S = 5.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class VideoWorker:
    def __init__(
        self,
        runner: VideoRunner,
        store: JobStore,
        artifacts: ArtifactStore,
        metrics: VideoMetrics,
        *,
        worker_id: str | None = None,
    ):
        self.runner, self.store, self.artifacts, self.metrics = runner, store, artifacts, metrics
        self.worker_id = worker_id or default_worker_id()
        self.running: Claim | None = None
        self.stopping = False
        self._halt = threading.Event()  # interrupts backoff sleeps at shutdown
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tf-video-worker", daemon=True)
            self._thread.start()

    def shutdown(self, timeout_s: float = 30.0) -> int:
        """Stop claiming, stop the running job at its next step (handed back, or cancelled by the embedded store with
        what was queued), wait for the thread; returns the jobs cancelled."""
        self.stopping = True
        self._halt.set()
        try:
            states = self.store.shutdown()
        except StoreUnavailable:
            states = []
        for state in states:
            self.metrics.inc("jobs_cancelled_total", reason="shutdown", state=state)
        running = self.running
        if running is not None:
            running.stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("video worker still busy %.0f s after shutdown was requested", timeout_s)
        return len(states)

    # -- the loop --------------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        next_sweep, backoff = 0.0, 0.2
        while not self.stopping:
            try:
                if time.monotonic() >= next_sweep:
                    self.store.sweep(self.artifacts)
                    next_sweep = time.monotonic() + self.store.policy.sweep_s
                claim = self.store.claim(self.worker_id, self.store.policy.poll_s)
                backoff = 0.2
            except StoreUnavailable as exc:
                log.warning("video worker: the job store is unavailable (%s); retrying in %.1f s", exc, backoff)
                self._halt.wait(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            except Exception:  # the worker must survive anything
                log.exception("video worker: claiming a job failed")
                self._halt.wait(1.0)
                continue
            if claim is None:
                continue
            self.running = claim
            try:
                self._execute(claim)
            except Exception:  # _execute records what it can; the thread goes on
                log.exception("video worker: unexpected error around job %s", claim.job.id)
            finally:
                self.running = None

    def _execute(self, claim: Claim) -> None:
        job = claim.job
        staged = self.artifacts.staging_path(job.id, claim.attempt)
        stages = StageClock()
        log.info("%s", started_line(job, claim.attempt))
        hooks = JobHooks(
            progress=lambda done, total: self._progress(claim, stages, done, total),
            cancelled=lambda: self._before_step(claim, stages),
            stage=lambda stage: self._enter(claim, stages, stage),
        )
        outcome: RunOutcome | None = None
        error, stopped_at, published = None, None, False
        try:
            with LeaseKeeper(lambda: self._renew(claim), self.store.policy.lease_s / 3):
                outcome = self.runner.run(self._job_request(job), staged, hooks)
                self._enter(claim, stages, "publishing")  # also asks: still ours, not cancelled during the decode?
                if not claim.stop.is_set():
                    self.artifacts.publish(job.id, staged)
                    published = True
        except JobCancelled as exc:
            stopped_at = exc.step
        except Exception as exc:  # any model or storage error becomes the job's error, told to the client
            if is_out_of_memory(exc):  # this job was too large for the memory free now; the next one may fit
                log.error("video job %s ran out of memory: %s", job.id, what_ran_out(exc))
                error = {"code": "out_of_memory", "message": encodable_text(out_of_memory_message(exc, VIDEO_ADVICE))}
            else:
                log.exception("video job %s: the run raised", job.id)
                error = {"code": "generation_failed", "message": encodable_text(f"{type(exc).__name__}: {exc}")}
        finally:
            self.artifacts.discard(staged)
            stages.stop()
        if error is not None and error["code"] == "out_of_memory":
            free_cached_memory()  # here, once the exception and the job's tensors in its traceback are gone

        if self.stopping and not published and error is None:
            self._record(lambda: self.store.release(claim, stopped_at))
            log.info("video job %s stopped by the shutdown after %.2f s", job.id, stages.elapsed())
            return
        if error is not None:
            ending = Ending("failed", error=error)
        elif published and outcome is not None:
            ending = Ending("completed", result=outcome.as_dict(), video_file=f"{job.id}.mp4")
        else:
            ending = Ending("cancelled", stopped_at_step=stopped_at)
        status = self._record(lambda: self.store.finish(claim, ending))
        line = ended_line(job, status, stages, outcome=outcome, error=error, stopped_at=stopped_at)
        (log.warning if status == "failed" else log.info)("%s", line)
        if published and status not in ("completed", None):  # cancelled after the file was in place
            self.artifacts.delete(job.id)
        if status is not None and job.job_request.get("media"):  # ended for good: its inputs are not needed again
            self._record(lambda: self.artifacts.delete_inputs(job.id))
        if status == "completed" and outcome is not None:
            self.metrics.inc("jobs_completed_total")
            self.metrics.inc("inference_seconds_total", outcome.inference_time_s)
            self.metrics.inc("frames_generated_total", outcome.frames)
            self.metrics.observe(outcome.inference_time_s)
        elif status == "failed":
            self.metrics.inc("jobs_failed_total")

    def _job_request(self, job) -> JobRequest:
        """The job's request with its media's bytes, read back from the artifact store."""
        job_request = JobRequest.from_dict(job.job_request)
        if not job_request.media:
            return job_request
        try:
            blobs = self.artifacts.read_inputs(job.id, len(job_request.media))
        except MissingArtifact as exc:
            raise ValueError(f"the job's media are gone: {exc}") from None
        return job_request.with_media_data(blobs)

    def _before_step(self, claim: Claim, stages: StageClock) -> bool:
        """The pipeline's `cancelled()`, asked before each denoising step: the first one starts "denoising"."""
        if stages.current == "starting":
            self._enter(claim, stages, "denoising")
        return claim.stop.is_set()

    def _progress(self, claim: Claim, stages: StageClock, done: int, total: int) -> None:
        """After each denoising step; after the last one the pipeline decodes."""
        stage = "decoding" if done >= total else "denoising"
        self._renew(claim, done, total, stage if stages.enter(stage) else None)

    def _enter(self, claim: Claim, stages: StageClock, stage: str) -> None:
        """The job entered `stage`: recorded with a lease renewal (which also reads a cancel back)."""
        if stages.enter(stage):
            self._renew(claim, stage=stage)

    def _renew(self, claim: Claim, done: int | None = None, total: int | None = None, stage: str | None = None) -> None:
        """A progress write; an unreachable database does not stop the run (the lease decides what happens)."""
        try:
            if stage is None:
                self.store.renew(claim, done, total)
            else:
                self.store.renew(claim, done, total, stage=stage)
        except StoreUnavailable as exc:
            log.warning("video job %s: could not renew its lease: %s", claim.job.id, exc)

    def _record(self, write: Callable[[], T]) -> T | None:
        """Retry a final write until the store answers; at shutdown, leave the job to its lease instead."""
        delay = 0.2
        while True:
            try:
                return write()
            except StoreUnavailable as exc:
                if self.stopping:
                    log.warning("video worker: could not record a job's end at shutdown (%s); its lease will", exc)
                    return None
                log.warning("video worker: could not record a job's end (%s); retrying in %.1f s", exc, delay)
                self._halt.wait(delay)
                delay = min(MAX_BACKOFF_S, delay * 2)


class LeaseKeeper:
    """Renews a claim every `interval_s` while a job runs, so a long phase without denoising steps (text encoding,
    the VAE decode, muxing) does not lose the lease; a killed process stops renewing, which is the point."""

    def __init__(self, renew: Callable[[], None], interval_s: float):
        self._renew, self._interval = renew, interval_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tf-video-lease", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            self._renew()
