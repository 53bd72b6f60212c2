"""The video job table in PostgreSQL, created or migrated when a replica starts.

One row is both the job's record and its place in the queue (why a plain table rather than a job library: the
"Several replicas" section of the README). Times are seconds since the epoch on the database's clock, so leases do
not depend on the replicas' clocks agreeing. What comes from clients (the prompt, the request) is in `body`, a `json`
column: `json` keeps the text as sent, so a NUL (`\\u0000`), which `text` and `jsonb` refuse, is stored and read back.
The body's keys are postgres.py's `BODY_FIELDS`. The first migration's comment calls `job_request` by its old name,
`spec` (a shipped migration is never edited); rows written before the rename keep `spec` and read the same.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (  # MIGRATIONS[i] takes the schema from version i to i + 1; never edit a shipped one
    """
    CREATE TABLE video_jobs (
        seq bigserial UNIQUE NOT NULL,          -- creation order: the FIFO and the listing's order
        id text PRIMARY KEY,
        status text NOT NULL CHECK (status IN ('queued', 'in_progress', 'completed', 'failed', 'cancelled')),
        body json NOT NULL,                     -- model, prompt, request, spec, plan: fixed at creation
        created_at double precision NOT NULL,
        progress integer NOT NULL DEFAULT 0,
        started_at double precision,
        finished_at double precision,
        expires_at double precision,            -- retention: the job reads as deleted from then on
        error json,
        result json,
        cancel_requested boolean NOT NULL DEFAULT false,
        cancel_reason text,
        cancelled_at_step integer,
        video_file text,
        attempts integer NOT NULL DEFAULT 0,
        max_attempts integer NOT NULL,
        worker text,                            -- the replica that runs (or last ran) it
        lease_until double precision,           -- set while a replica holds it
        revision integer NOT NULL DEFAULT 0
    );
    CREATE INDEX video_jobs_queued ON video_jobs (seq) WHERE status = 'queued';
    CREATE INDEX video_jobs_leased ON video_jobs (lease_until) WHERE lease_until IS NOT NULL;
    CREATE INDEX video_jobs_expiring ON video_jobs (expires_at) WHERE expires_at IS NOT NULL;
    """,
    """
    ALTER TABLE video_jobs ADD COLUMN stage text;  -- a running job's stage (starting, denoising, ..., publishing)
    """,
)
SCHEMA_LOCK = 0x7465_6C65_0001  # pg_advisory_xact_lock key: one replica migrates at a time
COMPONENT = "video_jobs"


def migrate(conn) -> int:
    """Bring the schema to the newest version in one transaction; returns that version. A database already past
    what this code knows (a newer replica migrated it) is refused rather than guessed at."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS telefuser_schema (component text PRIMARY KEY, version integer NOT NULL)"
        )
        row = conn.execute("SELECT version FROM telefuser_schema WHERE component = %s", (COMPONENT,)).fetchone()
        version = row[0] if row else 0
        if version > len(MIGRATIONS):
            raise RuntimeError(
                f"the database's {COMPONENT} schema is version {version}, newer than this telefuser knows "
                f"({len(MIGRATIONS)}); upgrade this replica"
            )
        for step in MIGRATIONS[version:]:
            conn.execute(step)
        conn.execute(
            "INSERT INTO telefuser_schema (component, version) VALUES (%s, %s) "
            "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
            (COMPONENT, len(MIGRATIONS)),
        )
    return len(MIGRATIONS)
