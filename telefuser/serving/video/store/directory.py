"""MP4s in a directory (`--artifacts DIR`, alias `--output-dir`): one server's, or shared by replicas (NFS, a
Kubernetes ReadWriteMany volume).

Each attempt writes its own dot-named staging file in the same directory, so publishing is one rename on one
filesystem (atomic), and two replicas never write the same file: a replica whose lease was taken over finishes into
its own staging name and is then refused by the job store. A job's media are `<id>.input-<n>` beside its MP4.
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
        for pattern in (".video_*.partial.mp4", ".video_*.input-*.tmp"):
            for leftover in self.dir.glob(pattern):
                leftover.unlink(missing_ok=True)

    def delete(self, job_id: str) -> None:
        self.path(job_id).unlink(missing_ok=True)
        self.delete_inputs(job_id)

    def input_path(self, job_id: str, index: int) -> Path:
        return self.dir / f"{job_id}.input-{index}"

    def put_inputs(self, job_id: str, blobs: list[bytes]) -> None:
        for index, blob in enumerate(blobs):
            tmp = self.dir / f".{job_id}.input-{index}.tmp"
            tmp.write_bytes(blob)
            os.replace(tmp, self.input_path(job_id, index))

    def read_inputs(self, job_id: str, count: int) -> list[bytes]:
        try:
            return [self.input_path(job_id, index).read_bytes() for index in range(count)]
        except FileNotFoundError:
            raise MissingArtifact(f"the media of video {job_id} are missing from the output directory") from None

    def delete_inputs(self, job_id: str) -> None:
        for path in self.dir.glob(f"{job_id}.input-*"):
            path.unlink(missing_ok=True)

    def response(self, job_id: str, *, filename: str, expires_at: float | None) -> FileResponse:
        path = self.path(job_id)
        if not path.is_file():
            raise MissingArtifact(f"the file of video {job_id} is missing from the output directory")
        return FileResponse(path, media_type="video/mp4", filename=filename)
