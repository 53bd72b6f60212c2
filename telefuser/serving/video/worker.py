"""The video service's core: all jobs, a bounded FIFO of queued ones, and one worker thread running them in order.

One GPU group computes one clip at a time, so one thread calls `runner.run` while the event loop only submits,
cancels, deletes and reads (serving/README.md). A running job that is cancelled is `cancelled` at once and the
runner stops at its next denoising step (`hooks.cancelled()`), its output discarded.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any

from ..common.request_body import encodable_text
from .contract import JobCancelled, RunHooks, VideoRunner, VideoSpec
from .jobs import FINISHED, JobStore, VideoJob, encode_record
from .metrics import VideoMetrics

log = logging.getLogger("telefuser.serving")


class QueueFull(Exception):
    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ShuttingDown(Exception):
    pass


class Unstorable(ValueError):
    """A job whose record is not strict UTF-8 JSON: refused before it is queued or written."""


class VideoQueue:
    def __init__(self, runner: VideoRunner, store: JobStore, metrics: VideoMetrics, *, max_queue: int):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.runner, self.store, self.metrics, self.max_queue = runner, store, metrics, max_queue
        self.jobs: dict[str, VideoJob] = {job.id: job for job in store.load()}
        self.running: VideoJob | None = None
        self.stopping = False
        self._pending: deque[VideoJob] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tf-video-worker", daemon=True)
            self._thread.start()

    def shutdown(self, timeout_s: float = 30.0) -> int:
        """Refuse new jobs, cancel the queued and the running one, wait for the worker; returns jobs cancelled."""
        with self._cond:
            self.stopping = True
            victims = list(self._pending) + ([self.running] if self.running is not None else [])
            records = [self._cancel_locked(job, "shutdown") for job in victims]
            self._pending.clear()
            self._cond.notify_all()
        for record in records:
            self._persist(record)
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("video worker still busy %.0f s after shutdown was requested", timeout_s)
        return len(records)

    # -- requests from the app ----------------------------------------------------------------------------------
    def submit(self, job: VideoJob) -> dict[str, Any]:
        try:
            encode_record(job.record())  # what cannot be stored and read back is never queued
        except ValueError as exc:
            raise Unstorable(f"the request cannot be stored as UTF-8 JSON: {exc}") from None
        with self._cond:
            if self.stopping:
                self.metrics.inc("jobs_rejected_total", reason="shutting_down")
                raise ShuttingDown("the server is shutting down")
            if len(self._pending) >= self.max_queue:
                self.metrics.inc("jobs_rejected_total", reason="queue_full")
                wait = self.retry_after_s()
                raise QueueFull(
                    f"queue full: {len(self._pending)} job(s) waiting (max_queue={self.max_queue}) "
                    f"and one running; retry in about {wait} s",
                    wait,
                )
            job.touch()
            self.jobs[job.id] = job
            self._pending.append(job)
            record = job.record()
            self.metrics.inc("jobs_submitted_total")
            self._cond.notify_all()
        self._persist(record)
        return record

    def describe(self, job_id: str, **kw: Any) -> dict[str, Any] | None:
        with self._cond:
            job = self.jobs.get(job_id)
            return None if job is None else job.to_object(**kw)

    def status_of(self, job_id: str) -> str | None:
        with self._cond:
            job = self.jobs.get(job_id)
            return None if job is None else job.status

    def list_ids(self) -> list[str]:
        with self._cond:
            return list(self.jobs)

    def cancel(self, job_id: str, reason: str = "client") -> str | None:
        """None if unknown; "cancelled" (it was queued or running: now cancelled); "busy" (cancelled already, its
        worker still stopping); "finished" (nothing to cancel)."""
        with self._cond:
            job = self.jobs.get(job_id)
            if job is None:
                return None
            if job is self.running and job.cancel_requested:
                return "busy"
            if job.status in FINISHED:
                return "finished"
            if job.status == "queued":
                self._pending.remove(job)
            record = self._cancel_locked(job, reason)
        self._persist(record)
        return "cancelled"

    def delete(self, job_id: str) -> bool:
        """Forget a finished job and delete its files; False if unknown or not finished."""
        with self._cond:
            job = self.jobs.get(job_id)
            if job is None or job.status not in FINISHED or job is self.running:
                return False
            del self.jobs[job_id]
        self.store.delete(job_id)
        self.metrics.inc("jobs_deleted_total")
        return True

    def counts(self) -> dict[str, Any]:
        with self._cond:
            by_status = {s: 0 for s in ("queued", "in_progress", "completed", "failed", "cancelled")}
            for job in self.jobs.values():
                by_status[job.status] += 1
            return {
                "queue_depth": len(self._pending),
                "max_queue": self.max_queue,
                "running": self.running.id if self.running is not None else None,
                "jobs": by_status,
            }

    def retry_after_s(self) -> int:
        mean = self.metrics.mean_observed()
        return int(min(3600, max(1, math.ceil(mean if mean is not None else 5.0))))

    # -- the worker ----------------------------------------------------------------------------------------------
    def _cancel_locked(self, job: VideoJob, reason: str) -> dict[str, Any]:
        state = job.status
        job.cancel_requested, job.cancel_reason = True, reason
        job.status, job.finished_at = "cancelled", time.time()
        job.touch()
        self.metrics.inc("jobs_cancelled_total", reason=reason, state=state)
        return job.record()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self.stopping:
                    self._cond.wait()
                if self.stopping:
                    return
                job = self._pending.popleft()
                self.running = job
                job.status, job.started_at = "in_progress", time.time()
                job.touch()
                record = job.record()
            self._persist(record)
            try:
                self._execute(job)
            except Exception:  # the worker must survive anything; _execute already recorded it
                log.exception("video worker: unexpected error around job %s", job.id)
            finally:
                with self._cond:
                    self.running = None
                    self._cond.notify_all()

    def _execute(self, job: VideoJob) -> None:
        spec = VideoSpec.from_dict(job.spec)
        hooks = RunHooks(
            progress=lambda done, total: self._progress(job, done, total), cancelled=lambda: job.cancel_requested
        )
        outcome, error, stopped_at = None, None, None
        try:
            outcome = self.runner.run(spec, self.store.partial_video_path(job.id), hooks)
            if not job.cancel_requested:
                self.store.publish_video(job.id)
        except JobCancelled as exc:
            stopped_at = exc.step
        except Exception as exc:  # any model error becomes the job's error, told to the client
            log.exception("video job %s failed", job.id)
            error = {"code": "generation_failed", "message": encodable_text(f"{type(exc).__name__}: {exc}")}
        finally:
            self.store.discard_partial(job.id)
        with self._cond:
            if job.cancel_requested:  # set by DELETE or shutdown, possibly after the runner had finished
                job.cancelled_at_step = stopped_at if stopped_at is not None else job.plan["dit_calls"]
                discard = True
            elif error is not None or outcome is None:
                job.status, job.error = "failed", error or {"code": "generation_failed", "message": "no result"}
                self.metrics.inc("jobs_failed_total")
                discard = True
            else:
                job.status, job.progress, job.result = "completed", 100, outcome.as_dict()
                job.video_file = self.store.video_path(job.id).name
                self.metrics.inc("jobs_completed_total")
                self.metrics.inc("inference_seconds_total", outcome.inference_time_s)
                self.metrics.inc("frames_generated_total", outcome.frames)
                self.metrics.observe(outcome.inference_time_s)
                discard = False
            if job.status != "cancelled":
                job.finished_at = time.time()
            job.touch()
            record = job.record()
        if discard:
            self.store.video_path(job.id).unlink(missing_ok=True)
        self._persist(record)

    def _persist(self, record: dict[str, Any]) -> None:
        """Write a record from the worker or a cancel; a failed write (a full disk) is logged, never fatal to the
        worker: the job's state in memory stays right and the next write retries with a newer revision."""
        try:
            self.store.save(record)
        except Exception:
            log.exception("video jobs: could not write the record of %s", record.get("id"))

    def _progress(self, job: VideoJob, done: int, total: int) -> None:
        percent = min(99, int(100 * done / max(1, total)))  # 100 only once the file is in place
        with self._cond:
            if percent > job.progress:
                job.progress = percent
