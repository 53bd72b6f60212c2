"""MP4s in a directory (`--artifacts DIR`, alias `--output-dir`): one server's, or shared by replicas (NFS, a
Kubernetes ReadWriteMany volume).

Each attempt writes its own dot-named staging file in the same directory, so publishing is one rename on one
filesystem (atomic), and two replicas never write the same file: a replica whose lease was taken over finishes into
its own staging name and is then refused by the job store.
"""

from __future__ import annotations

import os
from pathlib import Path

from starlette.responses import FileResponse

from .base import MissingArtifact


class DirectoryArtifacts:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.location = str(self.dir)

    def path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.mp4"

    def staging_path(self, job_id: str, attempt: int) -> Path:
        return self.dir / f".{job_id}.{attempt}.partial.mp4"  # ends in .mp4: PyAV picks the container from the name

    def publish(self, job_id: str, staged: Path) -> None:
        os.replace(staged, self.path(job_id))

    def discard(self, staged: Path) -> None:
        staged.unlink(missing_ok=True)

    def clear_staging(self) -> None:
        for leftover in self.dir.glob(".video_*.partial.mp4"):
            leftover.unlink(missing_ok=True)

    def delete(self, job_id: str) -> None:
        self.path(job_id).unlink(missing_ok=True)

    def response(self, job_id: str, *, filename: str, expires_at: float | None) -> FileResponse:
        path = self.path(job_id)
        if not path.is_file():
            raise MissingArtifact(f"the file of video {job_id} is missing from the output directory")
        return FileResponse(path, media_type="video/mp4", filename=filename)
