"""`telefuser serve`'s flags for where jobs and MP4s live and how the job queue behaves, checked before the model
loads, and the stores they open (on rank 0 only, once the model is up)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from ...arg_types import positive_float, positive_int
from ..common.replica import replica_id
from ..common.startup import require_package
from .store import ArtifactStore, JobStore, QueuePolicy, open_artifacts, open_job_store
from .store.base import StoreUnavailable

log = logging.getLogger("telefuser.serving")
JOB_STORE_ENV = "TELEFUSER_JOB_STORE"


def add_replica_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("jobs and replicas (README: 'Several replicas')")
    g.add_argument(
        "--job-store",
        default=os.environ.get(JOB_STORE_ENV, "embedded"),
        help=f"'embedded' (default: one server, records in the --artifacts directory) or postgresql://user@host/db "
        f"shared by every replica (also ${JOB_STORE_ENV}; put the password in PGPASSWORD or ~/.pgpass)",
    )
    g.add_argument("--s3-endpoint", default=None, help="an S3-compatible endpoint URL (MinIO, Ceph...) for s3://")
    g.add_argument(
        "--s3-redirect",
        action="store_true",
        help="answer .../content with a redirect to a presigned URL instead of streaming the MP4 through the replica",
    )
    g.add_argument("--replica-id", type=replica_id, default=None, help="this replica's name (default: host-pid)")
    g.add_argument(
        "--max-attempts", type=positive_int, default=3, help="runs of a job whose replica was lost, then worker_lost"
    )
    g.add_argument(
        "--lease-seconds",
        type=positive_float,
        default=30.0,
        help="a running job whose replica stops renewing is requeued",
    )
    g.add_argument(
        "--poll-seconds", type=positive_float, default=1.0, help="an idle replica checks for work this often"
    )
    g.add_argument(
        "--retention-hours",
        type=positive_float,
        default=None,
        help="delete finished jobs and their MP4s this long after they end (expires_at); default: keep them",
    )


def queue_policy(args: argparse.Namespace) -> QueuePolicy:
    retention = args.retention_hours * 3600 if args.retention_hours is not None else None
    return QueuePolicy(
        max_queue=args.max_queue,
        max_attempts=args.max_attempts,
        lease_s=args.lease_seconds,
        retention_s=retention,
        poll_s=args.poll_seconds,
    )


def check_replica_args(args: argparse.Namespace) -> None:
    """Bad values end the command before any model is built."""
    try:
        queue_policy(args)
    except ValueError as exc:
        raise SystemExit(f"telefuser serve: {exc}") from None
    if not (args.job_store == "embedded" or args.job_store.startswith(("postgresql://", "postgres://"))):
        raise SystemExit("telefuser serve: --job-store must be 'embedded' or a postgresql:// URL")
    if args.s3_endpoint and not str(args.artifacts).startswith("s3://"):
        raise SystemExit("telefuser serve: --s3-endpoint needs --artifacts s3://bucket/prefix")
    install = "pip install 'telefuser[serve]'"
    if args.job_store != "embedded":
        require_package("psycopg", flag="--job-store postgresql://...", install=install)
        require_package("psycopg_pool", flag="--job-store postgresql://...", install=install)
    if str(args.artifacts).startswith("s3://"):
        require_package("boto3", flag="--artifacts s3://...", install=install)
    else:
        _check_artifacts_directory(str(args.artifacts))


def _check_artifacts_directory(path: str) -> None:
    """The directory exists, or its nearest existing parent is a directory this user may write in (nothing is created
    here: followers check too, and never write)."""
    target = Path(path).absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        raise SystemExit(f"telefuser serve: --artifacts {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SystemExit(f"telefuser serve: --artifacts {path}: {existing} is not writable by this user")


def open_stores(args: argparse.Namespace) -> tuple[JobStore, ArtifactStore]:
    try:
        artifacts = open_artifacts(args.artifacts, s3_endpoint=args.s3_endpoint, s3_redirect=args.s3_redirect)
        return open_job_store(args.job_store, queue_policy(args), artifacts), artifacts
    except (ValueError, StoreUnavailable) as exc:
        raise SystemExit(f"telefuser serve: {exc}") from None
    except OSError as exc:  # the directory could not be made or used after all (a read-only or pseudo filesystem)
        raise SystemExit(
            f"telefuser serve: --artifacts {args.artifacts}: cannot create or use it ({exc.strerror or exc})"
        ) from None
