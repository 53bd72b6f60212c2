"""Where a video service under test keeps its jobs: the embedded files (the default) or a PostgreSQL database on the
test session's server, with the MP4s in a directory either way. The hostile-input and soak tests run on both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from telefuser.serving.video.app import create_video_app

STORE_KINDS = ("embedded", "postgresql")


@dataclass(frozen=True)
class StoreSite:
    directory: Path
    database: str | None = None  # a postgresql:// URL, or None for the embedded store

    def app(self, runner, *, max_queue: int = 16, **kw):
        """A video app on this site; two apps on one site see the same jobs (a restart, or another replica)."""
        if self.database is None:
            return create_video_app(runner, output_dir=self.directory, max_queue=max_queue, **kw)
        from telefuser.serving.video.store import QueuePolicy
        from telefuser.serving.video.store.directory import DirectoryArtifacts
        from telefuser.serving.video.store.postgres import PostgresJobStore

        store = PostgresJobStore(self.database, QueuePolicy(max_queue=max_queue))
        return create_video_app(runner, job_store=store, artifacts=DirectoryArtifacts(self.directory), **kw)


def store_site(kind: str, directory: Path, request) -> StoreSite:
    """`request` is pytest's; the PostgreSQL server starts only when a test asks for it."""
    if kind == "embedded":
        return StoreSite(directory)
    return StoreSite(directory, request.getfixturevalue("postgres_server").new_database())
