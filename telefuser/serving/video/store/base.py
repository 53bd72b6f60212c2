"""What the video service asks of a job store and an artifact store, and the errors they answer with.

A `JobStore` holds every job and its queue: the app submits, reads, lists, cancels and deletes through it; the worker
claims the oldest queued job, renews its claim with each progress write (which also tells it that a client cancelled)
and records how the job ended. Two implementations: `EmbeddedJobStore` (one process, records as files; the default)
and `PostgresJobStore` (any number of replicas; leases that expire when a replica dies). An `ArtifactStore` holds the
MP4s, and the media a job was submitted with (its keyframes and references, staged there at submission so that the
replica that runs the job can read them, also when it runs again after a lost lease): a directory
(`DirectoryArtifacts`, shareable between replicas) or an S3-compatible bucket (`S3Artifacts`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..jobs import VideoJob, encode_record

JOB_STATES = ("queued", "in_progress", "completed", "failed", "cancelled")


class QueueFull(Exception):
    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoreUnavailable(Exception):
    """The job database or the artifact store cannot be reached now: a 503 with Retry-After, never a 500."""

    def __init__(self, message: str, retry_after_s: int = 2):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unstorable(ValueError):
    """A job whose record is not strict UTF-8 JSON: refused before it is queued or written."""


def check_storable(job: VideoJob) -> None:
    """What cannot be stored and read back is never queued, in any store."""
    try:
        encode_record(job.record())
    except ValueError as exc:
        raise Unstorable(f"the request cannot be stored as UTF-8 JSON: {exc}") from None


class UnknownCursor(LookupError):
    """The `after` of a listing names no job."""


class MissingArtifact(LookupError):
    """A completed job whose MP4 is not in the artifact store (removed by hand, or a bucket rule)."""


@dataclass(frozen=True)
class QueuePolicy:
    """How jobs queue and run, the same on every replica (each takes it from its flags)."""

    max_queue: int = 16  # queued jobs in the whole store; more get 429
    max_attempts: int = 3  # claims of one job whose worker was lost before it fails as worker_lost
    lease_s: float = 30.0  # a claim not renewed for this long is taken back
    retention_s: float | None = None  # finished jobs (and their MP4s) are deleted this long after they ended
    poll_s: float = 1.0  # an idle worker looks for work at least this often (besides LISTEN/NOTIFY)

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not self.lease_s > 0 or not self.poll_s > 0:
            raise ValueError("the lease and the poll interval must be positive")
        if self.retention_s is not None and not self.retention_s > 0:
            raise ValueError(f"retention must be positive, got {self.retention_s}")

    def expiry(self, finished_at: float) -> float | None:
        return finished_at + self.retention_s if self.retention_s is not None else None

    @property
    def sweep_s(self) -> float:
        """How often a free worker looks for expired leases and jobs: twice a lease, so a lost job waits at most
        about 1.5 leases before it runs again."""
        return self.lease_s / 2


def progress_percent(done: int, total: int) -> int:
    """DiT calls done as a percentage, at most 99: 100 only once the MP4 is in place."""
    return min(99, int(100 * done / max(1, total)))


@dataclass
class Claim:
    """One worker's hold on one job for one attempt; `stop` is set when the job must stop (a client cancelled it,
    the lease was lost, or the worker is shutting down)."""

    job: VideoJob
    worker: str
    attempt: int
    stop: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Ending:
    """How a run ended, as the worker records it; a job cancelled meanwhile keeps `cancelled` whatever this says."""

    status: str  # "completed" or "failed"; "cancelled" when the run stopped because it was asked to
    result: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    video_file: str | None = None
    stopped_at_step: int | None = None  # DiT calls done when a cancelled run stopped


class JobStore(Protocol):
    policy: QueuePolicy
    location: str  # for logs and /v1/service/metadata; never holds a password

    # -- the app ---------------------------------------------------------------------------------------------------
    def submit(self, job: VideoJob) -> VideoJob:
        """Queue a new job (QueueFull past policy.max_queue); returns it as stored (its created_at, revision)."""
        ...

    def get(self, job_id: str) -> VideoJob | None: ...

    def page(self, *, limit: int, after: str | None, ascending: bool) -> tuple[list[VideoJob], bool]:
        """Up to `limit` jobs in creation order after the job `after` (UnknownCursor), and whether more follow."""
        ...

    def cancel(self, job_id: str, reason: str) -> tuple[str, str] | None:
        """None if unknown, else (outcome, the status it had): "cancelled" (it was queued or running), "busy" (it
        finished or was cancelled, and its worker is still letting go), "finished" (nothing to cancel)."""
        ...

    def delete(self, job_id: str, artifacts: ArtifactStore) -> bool:
        """Forget a finished job whose worker has let go, with its MP4; False if unknown or not finished."""
        ...

    def counts(self) -> dict[str, int]:
        """Jobs by status, in the whole store."""
        ...

    def held_by(self, worker: str) -> str | None:
        """The job `worker` holds now (claimed and not yet finished), if any."""
        ...

    def record_location(self, job_id: str) -> str | None:
        """Where the job's full record (with the pipeline's metrics) can be read, if it is a file."""
        ...

    # -- the worker ------------------------------------------------------------------------------------------------
    def claim(self, worker: str, wait_s: float) -> Claim | None:
        """The oldest queued job, now held by `worker`; waits up to `wait_s` for one to arrive."""
        ...

    def renew(self, claim: Claim, done: int | None = None, total: int | None = None, stage: str | None = None) -> None:
        """Extend the lease (and write progress and the running job's stage when given); sets `claim.stop` when the
        job was cancelled or the lease is no longer this worker's."""
        ...

    def finish(self, claim: Claim, ending: Ending) -> str | None:
        """Record how the run ended, only while the claim is still this worker's; returns the job's final status,
        None when the lease was lost meanwhile (another attempt owns the job now)."""
        ...

    def release(self, claim: Claim, stopped_at_step: int | None) -> None:
        """At shutdown: hand the running job back (PostgreSQL: queued again, the attempt not counted; embedded: it
        was cancelled by `shutdown`)."""
        ...

    def sweep(self, artifacts: ArtifactStore) -> None:
        """Housekeeping between jobs: take back expired leases, delete jobs past their retention."""
        ...

    def shutdown(self) -> list[str]:
        """Stop handing out claims and wake a waiting `claim`; returns the status each job it cancelled had
        (embedded: the queued and running ones; PostgreSQL: none, other replicas will run them)."""
        ...

    def close(self) -> None: ...


class ArtifactStore(Protocol):
    location: str  # for logs and /v1/service/metadata

    def staging_path(self, job_id: str, attempt: int) -> Path:
        """Where this replica's runner writes the MP4 of one attempt (a name no other attempt uses)."""
        ...

    def publish(self, job_id: str, staged: Path) -> None:
        """Make the staged file the job's MP4 (atomically: a reader sees the old one, none, or the new one)."""
        ...

    def discard(self, staged: Path) -> None: ...

    def clear_staging(self) -> None:
        """Remove every staged file left by a killed server; only for a store that one server uses alone."""
        ...

    def delete(self, job_id: str) -> None:
        """Remove the job's MP4 and its staged inputs (whichever exist)."""
        ...

    def put_inputs(self, job_id: str, blobs: list[bytes]) -> None:
        """Stage a job's media before it is queued (each atomically)."""
        ...

    def read_inputs(self, job_id: str, count: int) -> list[bytes]:
        """A job's staged media, in order; MissingArtifact when one is gone."""
        ...

    def delete_inputs(self, job_id: str) -> None:
        """Remove a job's staged media: it has ended for good (or was never queued)."""
        ...

    def response(self, job_id: str, *, filename: str, expires_at: float | None):
        """A Starlette response with the MP4 (streamed, or a redirect to a presigned URL); MissingArtifact."""
        ...
