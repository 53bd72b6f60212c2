"""The PostgreSQL job store: every replica of `telefuser serve` shares one table of jobs (postgres_schema.py).

- Claim: a free replica takes the oldest queued row with `FOR UPDATE SKIP LOCKED` (concurrent claims skip each other's
  row instead of waiting), counts an attempt and holds a lease until `lease_until`.
- Renew: each progress write pushes the lease forward and reads `cancel_requested` back, which is how a DELETE on
  any replica reaches the runner's `cancelled` hook (and, through the replay, every rank) within one step. Writes
  that end a run are fenced by (worker, attempt): a replica whose lease was taken over cannot overwrite the job.
- Sweep: a lease not renewed in time (replica killed, host lost) sends the job back to the queue, or fails it as
  `worker_lost` after max_attempts; jobs past their retention are deleted with their MP4s.
- Idle replicas wait on LISTEN/NOTIFY (a submit or a requeue notifies), polling every `poll_s` as a backstop.
- `max_queue` is global: submits take one advisory lock, count the queued rows and insert.
- A database that cannot be reached raises StoreUnavailable (a 503 with Retry-After in the app), never a 500.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Json
from psycopg_pool import ConnectionPool

from ..jobs import FINISHED, JOB_ID, VideoJob, current_field_names
from .base import (
    JOB_STATES,
    ArtifactStore,
    Claim,
    Ending,
    QueueFull,
    QueuePolicy,
    StoreUnavailable,
    UnknownCursor,
    check_storable,
    progress_percent,
)
from .postgres_schema import migrate

log = logging.getLogger("telefuser.serving")
CHANNEL = "telefuser_video_jobs"
SUBMIT_LOCK = 0x7465_6C65_0002
NOW = "extract(epoch FROM clock_timestamp())::double precision"
VISIBLE = f"(expires_at IS NULL OR expires_at > {NOW})"
COLUMNS = (
    "id, status, body, created_at, progress, started_at, finished_at, expires_at, error, result, cancel_requested, "
    "cancel_reason, cancelled_at_step, video_file, attempts, worker, revision, stage"
)
OWNED = "id = %(id)s AND worker = %(worker)s AND attempts = %(attempt)s AND lease_until IS NOT NULL"
CONNECT_TIMEOUT_S = 3
# A statement stuck behind a lock or a slow disk answers 503 instead of holding a request forever.
SESSION_OPTIONS = "-c statement_timeout=15000 -c lock_timeout=5000"
# What a row's `body` holds: the job's fields fixed at creation. A body written before `spec` was renamed
# `job_request` still reads (jobs.current_field_names); rows are not rewritten.
BODY_FIELDS = ("model", "prompt", "request", "job_request", "plan")


def _strict_dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _json(value: Any) -> Json | None:
    return None if value is None else Json(value, dumps=_strict_dumps)


def _job(row: dict[str, Any]) -> VideoJob:
    """The job of a row (the columns and the body's fields), whichever names its body was written with."""
    body = current_field_names(row["body"])
    fixed = {k: body[k] for k in BODY_FIELDS}
    return VideoJob(**fixed, **{k: v for k, v in row.items() if k != "body"})


def redacted(url: str) -> str:
    """The URL without its password (for logs and /v1/service/metadata)."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{info.get('host', '')}{port}/{info.get('dbname', '')}"


class PostgresJobStore:
    def __init__(self, url: str, policy: QueuePolicy, *, pool_size: int = 8, wait_s: float = 2.0):
        self.policy = policy
        self.location = redacted(url)
        self._url = url
        self._connect_args = {"connect_timeout": CONNECT_TIMEOUT_S, "options": SESSION_OPTIONS}
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            timeout=wait_s,  # a request waits this long for a connection, then gets a 503
            kwargs={"autocommit": True, "application_name": "telefuser-serve", **self._connect_args},
            check=ConnectionPool.check_connection,  # a connection broken by a database restart is replaced
            name="telefuser-video-jobs",
            open=False,
        )
        self._listener: psycopg.Connection | None = None
        self._stopping = False
        try:
            self._pool.open(wait=True, timeout=wait_s + CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as exc:
            self._pool.close()
            raise StoreUnavailable(f"cannot reach the job database {self.location}: {_first_line(exc)}") from None
        with self._connection() as conn:
            version = migrate(conn)
        log.info("video jobs: %s, schema version %d", self.location, version)

    # -- the app ---------------------------------------------------------------------------------------------------
    def submit(self, job: VideoJob) -> VideoJob:
        check_storable(job)
        body = {name: getattr(job, name) for name in BODY_FIELDS}
        with self._connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SUBMIT_LOCK,))
            (queued,) = conn.execute("SELECT count(*) FROM video_jobs WHERE status = 'queued'").fetchone()
            if queued >= self.policy.max_queue:
                raise QueueFull(
                    f"queue full: {queued} job(s) waiting on all replicas (max_queue={self.policy.max_queue})", 0
                )
            (created_at,) = conn.execute(
                f"INSERT INTO video_jobs (id, status, body, created_at, max_attempts, revision) "
                f"VALUES (%s, 'queued', %s, {NOW}, %s, 1) RETURNING created_at",
                (job.id, _json(body), self.policy.max_attempts),
            ).fetchone()
            conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))  # delivered at commit
        job.created_at, job.revision, job.status = created_at, 1, "queued"
        return job

    def get(self, job_id: str) -> VideoJob | None:
        if not JOB_ID.match(job_id):  # never sent to the database: a NUL in a text parameter is an error there
            return None
        row = self._one(f"SELECT {COLUMNS} FROM video_jobs WHERE id = %s AND {VISIBLE}", (job_id,))
        return _job(row) if row else None

    def page(self, *, limit: int, after: str | None, ascending: bool) -> tuple[list[VideoJob], bool]:
        direction, beyond = ("ASC", ">") if ascending else ("DESC", "<")
        with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            if after is None:
                cur.execute(
                    f"SELECT {COLUMNS} FROM video_jobs WHERE {VISIBLE} ORDER BY seq {direction} LIMIT %s", (limit + 1,)
                )
            else:
                cursor = None
                if JOB_ID.match(after):
                    cursor = cur.execute(f"SELECT seq FROM video_jobs WHERE id = %s AND {VISIBLE}", (after,)).fetchone()
                if cursor is None:
                    raise UnknownCursor(after)
                cur.execute(
                    f"SELECT {COLUMNS} FROM video_jobs WHERE {VISIBLE} AND seq {beyond} %s "
                    f"ORDER BY seq {direction} LIMIT %s",
                    (cursor["seq"], limit + 1),
                )
            rows = cur.fetchall()
        return [_job(row) for row in rows[:limit]], len(rows) > limit

    def cancel(self, job_id: str, reason: str) -> tuple[str, str] | None:
        if not JOB_ID.match(job_id):
            return None
        with self._connection() as conn, conn.transaction():
            row = conn.execute(
                f"SELECT status, lease_until IS NOT NULL FROM video_jobs WHERE id = %s AND {VISIBLE} FOR UPDATE",
                (job_id,),
            ).fetchone()
            if row is None:
                return None
            status, held = row
            if status in FINISHED:
                return ("busy" if held else "finished"), status
            conn.execute(
                f"UPDATE video_jobs SET status = 'cancelled', cancel_requested = true, cancel_reason = %s, "
                f"finished_at = {NOW}, expires_at = {NOW} + %s, revision = revision + 1 WHERE id = %s",
                (reason, self.policy.retention_s, job_id),
            )
        return "cancelled", status

    def delete(self, job_id: str, artifacts: ArtifactStore) -> bool:
        if not JOB_ID.match(job_id):
            return False
        with self._connection() as conn, conn.transaction():
            gone = conn.execute(
                f"DELETE FROM video_jobs WHERE id = %s AND status = ANY(%s) AND lease_until IS NULL AND {VISIBLE} "
                f"RETURNING id",
                (job_id, list(FINISHED)),
            ).fetchone()
            if gone is None:
                return False
            artifacts.delete(job_id)  # inside the transaction: if the bucket refuses, the job stays
        return True

    def counts(self) -> dict[str, int]:
        with self._connection() as conn:
            rows = conn.execute(f"SELECT status, count(*) FROM video_jobs WHERE {VISIBLE} GROUP BY status").fetchall()
        return dict.fromkeys(JOB_STATES, 0) | dict(rows)

    def held_by(self, worker: str) -> str | None:
        row = self._one("SELECT id FROM video_jobs WHERE lease_until IS NOT NULL AND worker = %s LIMIT 1", (worker,))
        return row["id"] if row else None

    def record_location(self, job_id: str) -> str | None:
        return None  # the record is the row

    # -- the worker ------------------------------------------------------------------------------------------------
    def claim(self, worker: str, wait_s: float) -> Claim | None:
        if self._stopping:
            return None
        claim = self._take_oldest(worker)
        if claim is None and not self._stopping:
            self._wait_for_work(wait_s)
            claim = None if self._stopping else self._take_oldest(worker)
        return claim

    def renew(self, claim: Claim, done: int | None = None, total: int | None = None, stage: str | None = None) -> None:
        percent = None if done is None or total is None else progress_percent(done, total)
        row = self._one(
            f"UPDATE video_jobs SET lease_until = {NOW} + %(lease)s, progress = CASE "
            f"WHEN status = 'in_progress' AND %(percent)s::integer IS NOT NULL THEN GREATEST(progress, %(percent)s) "
            f"ELSE progress END, stage = CASE WHEN status = 'in_progress' AND %(stage)s::text IS NOT NULL "
            f"THEN %(stage)s ELSE stage END WHERE {OWNED} RETURNING cancel_requested",
            self._owned(claim) | {"lease": self.policy.lease_s, "percent": percent, "stage": stage},
        )
        if row is None:
            log.warning(
                "video job %s: the lease of attempt %d was taken back; stopping it", claim.job.id, claim.attempt
            )
        if row is None or row["cancel_requested"]:
            claim.stop.set()

    def finish(self, claim: Claim, ending: Ending) -> str | None:
        row = self._one(
            f"UPDATE video_jobs SET "
            f"status = CASE WHEN cancel_requested THEN status ELSE %(status)s END, "
            f"progress = CASE WHEN NOT cancel_requested AND %(status)s = 'completed' THEN 100 ELSE progress END, "
            f"result = CASE WHEN cancel_requested THEN NULL ELSE %(result)s::json END, "
            f"error = CASE WHEN cancel_requested THEN error ELSE %(error)s::json END, "
            f"video_file = CASE WHEN cancel_requested THEN NULL ELSE %(video_file)s END, "
            f"cancelled_at_step = CASE WHEN cancel_requested THEN %(step)s ELSE cancelled_at_step END, "
            f"finished_at = CASE WHEN cancel_requested THEN finished_at ELSE {NOW} END, "
            f"expires_at = CASE WHEN cancel_requested THEN expires_at ELSE {NOW} + %(retention)s END, "
            f"lease_until = NULL, revision = revision + 1 WHERE {OWNED} RETURNING status",
            self._owned(claim)
            | {
                "status": ending.status,
                "result": _json(ending.result),
                "error": _json(ending.error),
                "video_file": ending.video_file,
                "step": self._stopped_at(claim, ending.stopped_at_step),
                "retention": self.policy.retention_s,
            },
        )
        if row is None:
            log.warning("video job %s: attempt %d ended after its lease was taken back", claim.job.id, claim.attempt)
        return row["status"] if row else None

    def release(self, claim: Claim, stopped_at_step: int | None) -> None:
        """Back to the queue without counting the attempt (this replica is shutting down; the job did nothing
        wrong), unless a client cancelled it meanwhile."""
        with self._connection() as conn, conn.transaction():
            row = conn.execute(
                f"UPDATE video_jobs SET "
                f"status = CASE WHEN cancel_requested THEN status ELSE 'queued' END, "
                f"attempts = CASE WHEN cancel_requested THEN attempts ELSE attempts - 1 END, "
                f"cancelled_at_step = CASE WHEN cancel_requested THEN %(step)s ELSE cancelled_at_step END, "
                f"progress = CASE WHEN cancel_requested THEN progress ELSE 0 END, "
                f"lease_until = NULL, revision = revision + 1 WHERE {OWNED} RETURNING status",
                self._owned(claim) | {"step": self._stopped_at(claim, stopped_at_step)},
            ).fetchone()
            if row is not None and row[0] == "queued":
                conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
                log.info("video job %s: handed back to the queue at shutdown", claim.job.id)

    def sweep(self, artifacts: ArtifactStore) -> None:
        self._take_back_expired_leases()
        self._delete_expired_jobs(artifacts)

    def shutdown(self) -> list[str]:
        self._stopping = True  # a waiting claim returns within poll_s; the queued jobs are the other replicas' now
        return []

    def close(self) -> None:
        self._stopping = True
        if self._listener is not None:
            self._listener.close()
        self._pool.close()

    # -- inside -----------------------------------------------------------------------------------------------------
    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailable(f"the job database is unavailable ({_first_line(exc)})") from None

    def _one(self, query: str, params: Any) -> dict[str, Any] | None:
        with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(query, params).fetchone()

    @staticmethod
    def _owned(claim: Claim) -> dict[str, Any]:
        return {"id": claim.job.id, "worker": claim.worker, "attempt": claim.attempt}

    @staticmethod
    def _stopped_at(claim: Claim, step: int | None) -> int:
        return step if step is not None else int(claim.job.plan["dit_calls"])

    def _take_oldest(self, worker: str) -> Claim | None:
        row = self._one(
            f"WITH next AS (SELECT id FROM video_jobs WHERE status = 'queued' ORDER BY seq LIMIT 1 "
            f"FOR UPDATE SKIP LOCKED) "
            f"UPDATE video_jobs AS j SET status = 'in_progress', worker = %(worker)s, attempts = j.attempts + 1, "
            f"started_at = {NOW}, lease_until = {NOW} + %(lease)s, progress = 0, stage = NULL, "
            f"revision = j.revision + 1 "
            f"FROM next WHERE j.id = next.id RETURNING {', '.join('j.' + c for c in COLUMNS.split(', '))}",
            {"worker": worker, "lease": self.policy.lease_s},
        )
        if row is None:
            return None
        job = _job(row)
        return Claim(job, worker, job.attempts)

    def _wait_for_work(self, wait_s: float) -> None:
        """Until a NOTIFY (a submit, a requeue) or `wait_s`. The LISTEN connection stays open between waits, so a
        notification sent while this replica was busy is still there at the next wait."""
        try:
            if self._listener is None or self._listener.closed:
                self._listener = psycopg.connect(self._url, autocommit=True, **self._connect_args)
                self._listener.execute(f"LISTEN {CHANNEL}")
            for _ in self._listener.notifies(timeout=wait_s, stop_after=1):
                pass
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if self._listener is not None:
                self._listener.close()
            self._listener = None
            raise StoreUnavailable(f"the job database is unavailable ({_first_line(exc)})") from None

    def _take_back_expired_leases(self) -> None:
        with self._connection() as conn, conn.transaction():
            rows = conn.execute(
                f"UPDATE video_jobs AS j SET "
                f"status = CASE WHEN j.status <> 'in_progress' THEN j.status "
                f"  WHEN j.attempts < j.max_attempts THEN 'queued' ELSE 'failed' END, "
                f"error = CASE WHEN j.status = 'in_progress' AND j.attempts >= j.max_attempts "
                f"  THEN json_build_object('code', 'worker_lost', 'message', format("
                f"'the replica running it (%%s) stopped renewing its lease on attempt %%s of %%s (--max-attempts)', "
                f"j.worker, j.attempts, j.max_attempts)) ELSE j.error END, "
                f"finished_at = CASE WHEN j.status = 'in_progress' AND j.attempts >= j.max_attempts "
                f"  THEN {NOW} ELSE j.finished_at END, "
                f"expires_at = CASE WHEN j.status = 'in_progress' AND j.attempts >= j.max_attempts "
                f"  THEN {NOW} + %s ELSE j.expires_at END, "
                f"progress = CASE WHEN j.status = 'in_progress' AND j.attempts < j.max_attempts THEN 0 "
                f"  ELSE j.progress END, "
                f"lease_until = NULL, revision = j.revision + 1 "
                f"FROM (SELECT id FROM video_jobs WHERE lease_until < {NOW} FOR UPDATE SKIP LOCKED) AS lost "
                f"WHERE j.id = lost.id RETURNING j.id, j.status, j.worker, j.attempts",
                (self.policy.retention_s,),
            ).fetchall()
            for job_id, status, worker, attempts in rows:
                log.warning(
                    "video job %s: replica %s lost its lease on attempt %d; now %s", job_id, worker, attempts, status
                )
            if any(status == "queued" for _, status, _, _ in rows):
                conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))

    def _delete_expired_jobs(self, artifacts: ArtifactStore, batch: int = 100) -> None:
        with self._connection() as conn, conn.transaction():
            ids = [
                job_id
                for (job_id,) in conn.execute(
                    f"SELECT id FROM video_jobs WHERE expires_at <= {NOW} AND lease_until IS NULL "
                    f"LIMIT %s FOR UPDATE SKIP LOCKED",
                    (batch,),
                ).fetchall()
            ]
            for job_id in ids:
                artifacts.delete(job_id)
            if ids:
                conn.execute("DELETE FROM video_jobs WHERE id = ANY(%s)", (ids,))
                log.info("video jobs: deleted %d job(s) past their retention", len(ids))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
