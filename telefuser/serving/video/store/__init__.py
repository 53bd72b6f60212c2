"""Where the video service's jobs and MP4s live: `--job-store` (embedded files, or `postgresql://...` for replicas)
and `--artifacts` (a directory, or `s3://bucket/prefix`). PostgreSQL and S3 are imported only when asked for, so the
embedded default needs neither psycopg nor boto3."""

from __future__ import annotations

from pathlib import Path

from .base import ArtifactStore, JobStore, QueuePolicy
from .directory import DirectoryArtifacts

__all__ = ["ArtifactStore", "JobStore", "QueuePolicy", "open_artifacts", "open_embedded", "open_job_store"]

EMBEDDED = "embedded"


def open_artifacts(where: str | Path, *, s3_endpoint: str | None = None, s3_redirect: bool = False) -> ArtifactStore:
    """`s3://bucket/prefix` -> S3Artifacts (credentials from the usual AWS variables); anything else is a directory."""
    text = str(where)
    if text.startswith("s3://"):
        from .s3 import S3Artifacts

        return S3Artifacts(text, endpoint_url=s3_endpoint, redirect=s3_redirect)
    if s3_endpoint is not None:
        raise ValueError("--s3-endpoint needs --artifacts s3://bucket/prefix")
    return DirectoryArtifacts(text)


def open_embedded(
    directory: str | Path, policy: QueuePolicy, artifacts: ArtifactStore | None = None
) -> tuple[JobStore, ArtifactStore]:
    from .embedded import EmbeddedJobStore

    artifacts = artifacts if artifacts is not None else DirectoryArtifacts(directory)
    return EmbeddedJobStore(directory, policy, artifacts), artifacts


def open_job_store(url: str, policy: QueuePolicy, artifacts: ArtifactStore) -> JobStore:
    """`embedded` keeps records beside the MP4s in the artifacts directory (one server); `postgresql://...` is shared
    by every replica that names it."""
    if url == EMBEDDED:
        if not isinstance(artifacts, DirectoryArtifacts):
            raise ValueError(
                "the embedded job store keeps its records in the --artifacts directory; with S3 artifacts use "
                "--job-store postgresql://..."
            )
        return open_embedded(artifacts.dir, policy, artifacts)[0]
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresJobStore

        return PostgresJobStore(url, policy)
    raise ValueError(f"--job-store must be 'embedded' or a postgresql:// URL, got {url.split('://')[0]!r}")
