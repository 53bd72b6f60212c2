"""The embedded job store (the default): every job in this process's memory, a FIFO of queued ones, each record also
a JSON file (`RecordFiles`) so finished jobs survive a restart.

One server per directory: at start it claims what it finds, so a job a killed server left unfinished becomes failed
(`server_restarted`) and staged MP4s are removed. Several replicas need `PostgresJobStore`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..jobs import FINISHED, RecordFiles, VideoJob
from .base import (
    JOB_STATES,
    ArtifactStore,
    Claim,
    Ending,
    QueueFull,
    QueuePolicy,
    UnknownCursor,
    check_storable,
    progress_percent,
)

log = logging.getLogger("telefuser.serving")


class EmbeddedJobStore:
    def __init__(self, directory: str | Path, policy: QueuePolicy, artifacts: ArtifactStore):
        self.policy = policy
        self.files = RecordFiles(directory)
        self.location = f"embedded (records in {self.files.dir})"
        artifacts.clear_staging()
        self._jobs: dict[str, VideoJob] = {job.id: job for job in self.files.load()}  # in creation order
        self._pending: deque[VideoJob] = deque()
        self._held: dict[str, Claim] = {}  # job id -> the claim of the worker running it
        self._stopping = False
        self._cond = threading.Condition()

    # -- the app ---------------------------------------------------------------------------------------------------
    def submit(self, job: VideoJob) -> VideoJob:
        check_storable(job)
        with self._cond:
            if len(self._pending) >= self.policy.max_queue:
                raise QueueFull(
                    f"queue full: {len(self._pending)} job(s) waiting (max_queue={self.policy.max_queue}) "
                    f"and one running",
                    0,
                )
            job.touch()
            self._jobs[job.id] = job
            self._pending.append(job)
            record = job.record()
            self._cond.notify_all()
        self._persist(record)
        return VideoJob.from_record(record)

    def get(self, job_id: str) -> VideoJob | None:
        with self._cond:
            job = self._jobs.get(job_id)
            return job.snapshot() if job is not None and job.visible(time.time()) else None

    def page(self, *, limit: int, after: str | None, ascending: bool) -> tuple[list[VideoJob], bool]:
        now = time.time()
        with self._cond:
            jobs = [job for job in self._jobs.values() if job.visible(now)]
            jobs = jobs if ascending else jobs[::-1]
            if after is not None:
                index = next((i for i, job in enumerate(jobs) if job.id == after), None)
                if index is None:
                    raise UnknownCursor(after)
                jobs = jobs[index + 1 :]
            return [job.snapshot() for job in jobs[:limit]], len(jobs) > limit

    def cancel(self, job_id: str, reason: str) -> tuple[str, str] | None:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or not job.visible(time.time()):
                return None
            was = job.status
            if job.status in FINISHED:
                return ("busy" if job_id in self._held else "finished"), was
            if job.status == "queued":
                self._pending.remove(job)
            record = self._cancel_locked(job, reason)
        self._persist(record)
        return "cancelled", was

    def delete(self, job_id: str, artifacts: ArtifactStore) -> bool:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or job.status not in FINISHED or job_id in self._held:
                return False
            del self._jobs[job_id]
        self.files.delete(job_id)
        artifacts.delete(job_id)
        return True

    def counts(self) -> dict[str, int]:
        now = time.time()
        by_status = dict.fromkeys(JOB_STATES, 0)
        with self._cond:
            for job in self._jobs.values():
                if job.visible(now):
                    by_status[job.status] += 1
        return by_status

    def held_by(self, worker: str) -> str | None:
        with self._cond:
            return next((job_id for job_id, claim in self._held.items() if claim.worker == worker), None)

    def record_location(self, job_id: str) -> str | None:
        return str(self.files.record_path(job_id))

    # -- the worker ------------------------------------------------------------------------------------------------
    def claim(self, worker: str, wait_s: float) -> Claim | None:
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._pending and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            if self._stopping:
                return None
            job = self._pending.popleft()
            job.status, job.started_at, job.worker, job.stage = "in_progress", time.time(), worker, None
            job.attempts += 1
            job.touch()
            claim = self._held[job.id] = Claim(job, worker, job.attempts)
            record = job.record()
        self._persist(record)
        return claim

    def renew(self, claim: Claim, done: int | None = None, total: int | None = None, stage: str | None = None) -> None:
        with self._cond:
            job = claim.job
            if done is not None and total is not None:
                job.progress = max(job.progress, progress_percent(done, total))
            if stage is not None and job.status == "in_progress":
                job.stage = stage
            if job.cancel_requested:
                claim.stop.set()

    def finish(self, claim: Claim, ending: Ending) -> str | None:
        with self._cond:
            job = claim.job
            self._held.pop(job.id, None)
            if job.cancel_requested:  # by DELETE or shutdown, possibly after the run had finished
                stopped = ending.stopped_at_step
                job.cancelled_at_step = stopped if stopped is not None else job.plan["dit_calls"]
            elif ending.status == "completed":
                job.status, job.progress, job.result, job.video_file = (
                    "completed",
                    100,
                    ending.result,
                    ending.video_file,
                )
            else:
                job.status, job.error = "failed", ending.error or {"code": "generation_failed", "message": "no result"}
            if job.status != "cancelled":
                job.finished_at = time.time()
            job.expires_at = self.policy.expiry(job.finished_at or time.time())
            job.touch()
            record = job.record()
            # on disk before any reader can see the ending: a client that saw "completed" finds it after a restart
            self._persist(record)
            self._cond.notify_all()
        return record["status"]

    def release(self, claim: Claim, stopped_at_step: int | None) -> None:
        self.finish(claim, Ending("cancelled", stopped_at_step=stopped_at_step))  # shutdown() cancelled it

    def sweep(self, artifacts: ArtifactStore) -> None:
        now = time.time()
        with self._cond:
            expired = [job.id for job in self._jobs.values() if not job.visible(now) and job.id not in self._held]
        for job_id in expired:
            self.delete(job_id, artifacts)

    def shutdown(self) -> list[str]:
        with self._cond:
            self._stopping = True
            victims = list(self._pending) + [c.job for c in self._held.values() if c.job.status not in FINISHED]
            states = [job.status for job in victims]
            records = [self._cancel_locked(job, "shutdown") for job in victims]
            self._pending.clear()
            self._cond.notify_all()
        for record in records:
            self._persist(record)
        return states

    def close(self) -> None:
        return None

    # -- inside -----------------------------------------------------------------------------------------------------
    def _cancel_locked(self, job: VideoJob, reason: str) -> dict[str, Any]:
        job.cancel_requested, job.cancel_reason = True, reason
        job.status, job.finished_at = "cancelled", time.time()
        job.expires_at = self.policy.expiry(job.finished_at)
        job.touch()
        claim = self._held.get(job.id)
        if claim is not None:
            claim.stop.set()  # the runner stops before its next step
        return job.record()

    def _persist(self, record: dict[str, Any]) -> None:
        """A failed write (a full disk) is logged, never fatal: the job's state in memory stays right and the next
        write retries with a newer revision."""
        try:
            self.files.save(record)
        except Exception:
            log.exception("video jobs: could not write the record of %s", record.get("id"))
