"""MP4s in an S3-compatible bucket (`--artifacts s3://bucket/prefix`, `--s3-endpoint` for MinIO, Ceph, R2...), through
boto3; credentials and region come from the usual AWS variables, profiles or instance roles.

The runner writes into this replica's private staging directory; the finished file is uploaded as
`<prefix>/<job id>.mp4` (an upload replaces an object atomically). `/content` streams the object through the replica,
or with `--s3-redirect` answers 307 to a presigned URL that lives until the job expires (at most a week, the
longest SigV4 allows), so the bytes go from the bucket to the client directly. A job's media are staged as
`<prefix>/<job id>.input-<n>` until it ends.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from starlette.responses import RedirectResponse, StreamingResponse

from .base import MissingArtifact, StoreUnavailable

MAX_PRESIGN_S = 7 * 24 * 3600
DEFAULT_PRESIGN_S = 3600
READ_BYTES = 1 << 20


class S3Artifacts:
    def __init__(self, url: str, *, endpoint_url: str | None = None, redirect: bool = False):
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"--artifacts {url!r}: name a bucket, s3://bucket/prefix")
        self.bucket, self.prefix, self.redirect = bucket, prefix.strip("/"), redirect
        self.location = url + (f" at {endpoint_url}" if endpoint_url else "")
        config = Config(connect_timeout=3, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"})
        self._s3 = boto3.client("s3", endpoint_url=endpoint_url, config=config)
        self._staging = Path(tempfile.mkdtemp(prefix="telefuser-staging-"))  # this replica's own: nobody else's files
        try:
            self._call(lambda: self._s3.head_bucket(Bucket=bucket), f"bucket {bucket!r}")
        except MissingArtifact:
            raise ValueError(f"{self.location}: no such bucket") from None

    def key(self, job_id: str) -> str:
        return f"{self.prefix}/{job_id}.mp4" if self.prefix else f"{job_id}.mp4"

    def staging_path(self, job_id: str, attempt: int) -> Path:
        return self._staging / f"{job_id}.{attempt}.mp4"

    def publish(self, job_id: str, staged: Path) -> None:
        extra = {"ContentType": "video/mp4"}
        self._call(lambda: self._s3.upload_file(str(staged), self.bucket, self.key(job_id), ExtraArgs=extra), job_id)

    def discard(self, staged: Path) -> None:
        staged.unlink(missing_ok=True)

    def clear_staging(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)
        self._staging.mkdir(parents=True, exist_ok=True)

    def delete(self, job_id: str) -> None:
        self._call(lambda: self._s3.delete_object(Bucket=self.bucket, Key=self.key(job_id)), job_id)
        self.delete_inputs(job_id)

    def input_key(self, job_id: str, index: int) -> str:
        return self.key(job_id).removesuffix(".mp4") + f".input-{index}"

    def put_inputs(self, job_id: str, blobs: list[bytes]) -> None:
        for index, blob in enumerate(blobs):
            key = self.input_key(job_id, index)
            self._call(lambda key=key, blob=blob: self._s3.put_object(Bucket=self.bucket, Key=key, Body=blob), job_id)

    def read_inputs(self, job_id: str, count: int) -> list[bytes]:
        blobs = []
        for index in range(count):
            key = self.input_key(job_id, index)
            obj = self._call(lambda key=key: self._s3.get_object(Bucket=self.bucket, Key=key), f"{job_id}'s media")
            blobs.append(obj["Body"].read())
        return blobs

    def delete_inputs(self, job_id: str) -> None:
        prefix = self.input_key(job_id, 0).removesuffix("0")
        listed = self._call(lambda: self._s3.list_objects_v2(Bucket=self.bucket, Prefix=prefix), job_id)
        for item in listed.get("Contents", []):
            self._call(lambda key=item["Key"]: self._s3.delete_object(Bucket=self.bucket, Key=key), job_id)

    def response(self, job_id: str, *, filename: str, expires_at: float | None):
        disposition = f'attachment; filename="{filename}"'
        if self.redirect:
            self._call(lambda: self._s3.head_object(Bucket=self.bucket, Key=self.key(job_id)), job_id)
            left = DEFAULT_PRESIGN_S if expires_at is None else int(expires_at - time.time())
            url = self._s3.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self.key(job_id), "ResponseContentDisposition": disposition},
                ExpiresIn=max(1, min(MAX_PRESIGN_S, left)),
            )
            return RedirectResponse(url, status_code=307)
        obj = self._call(lambda: self._s3.get_object(Bucket=self.bucket, Key=self.key(job_id)), job_id)
        headers = {"Content-Length": str(obj["ContentLength"]), "Content-Disposition": disposition}
        return StreamingResponse(_object_bytes(obj["Body"]), media_type="video/mp4", headers=headers)

    def _call(self, request, what: str):
        try:
            return request()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound"):
                raise MissingArtifact(f"the MP4 of {what} is missing from {self.location}") from None
            raise StoreUnavailable(f"the artifact store refused a request ({code})") from None
        except BotoCoreError as exc:
            raise StoreUnavailable(f"the artifact store is unavailable ({type(exc).__name__})") from None


def _object_bytes(body) -> Iterator[bytes]:
    """The object's bytes; the connection goes back to boto3's pool when the client has it all or goes away."""
    try:
        yield from body.iter_chunks(READ_BYTES)  # boto3's own word for a read of the body
    finally:
        body.close()
