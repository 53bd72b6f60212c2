"""Video jobs: the record of one request (`VideoJob`) and the embedded store's files of records (`RecordFiles`).

Each record is `<id>.json`, written under a temporary name and renamed, so a reader or a crash never sees half a
file. Nothing is stored that cannot be read back (`encode_record`, `encodable_text`), and on start `load()` marks jobs
a stopped server left unfinished as failed; PROTOCOL.md ("Files and restarts") has the rules. Where jobs live with
several replicas (PostgreSQL) and where their MP4s go (a directory, S3) is the `store` package's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .canvas import RESIZE_METHOD
from .contract import GUIDANCE_FIELDS

log = logging.getLogger("telefuser.serving")

STATUSES = ("queued", "in_progress", "completed", "failed", "cancelled")
FINISHED = ("completed", "failed", "cancelled")
SCHEMA = "telefuser.video_job/2"  # /2 renamed /1's `spec` to `job_request`; /1 records still load (RENAMED_FIELDS)
# Fields an earlier schema named otherwise: its name -> today's. Records and PostgreSQL bodies are read through it.
RENAMED_FIELDS = {"spec": "job_request"}  # telefuser.video_job/1
JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")


def new_job_id() -> str:
    return f"video_{uuid.uuid4().hex}"


def current_field_names(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a record, or a PostgreSQL job's body, which has no schema string) with the field names of earlier
    schemas read as today's: a job recorded before a rename loads as it was."""
    out = dict(data)
    for old, new in RENAMED_FIELDS.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
    return out


def encode_record(record: dict[str, Any]) -> bytes:
    """Strict UTF-8 JSON of a record or video object; ValueError (UnicodeEncodeError included) when it has none."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False).encode("utf-8")


@dataclass
class VideoJob:
    id: str
    model: str
    prompt: str
    request: dict[str, Any]  # the fields the client sent
    job_request: dict[str, Any]  # JobRequest.as_dict(): what the runner was asked to do (`spec` in schema /1)
    plan: dict[str, Any]  # VideoShape.as_dict(): size, frames, duration, dit_calls
    created_at: float = field(default_factory=time.time)
    status: str = "queued"
    progress: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    error: dict[str, str] | None = None  # {"code", "message"} when failed
    result: dict[str, Any] | None = None  # RunOutcome.as_dict() when completed
    cancel_requested: bool = False
    cancel_reason: str | None = None  # "client" (DELETE) or "shutdown"
    cancelled_at_step: int | None = None  # denoising calls done when a running job stopped
    video_file: str | None = None
    attempts: int = 0  # claims so far: a job whose worker was lost runs again, up to --max-attempts
    worker: str | None = None  # the replica that runs (or last ran) it
    expires_at: float | None = None  # when a finished job and its MP4 are deleted (--retention-hours)
    revision: int = 0  # bumped on every change; the store never overwrites a newer record with an older one
    stage: str | None = None  # while in_progress: contract.RUN_STAGES, as the worker last recorded it

    def current_stage(self) -> str:
        """What the job is doing: its status, or while it runs the stage it is in ("starting" until one is known)."""
        if self.status != "in_progress":
            return self.status
        return self.stage or "starting"

    def touch(self) -> None:
        self.revision += 1

    def record(self) -> dict[str, Any]:
        """The JSON written to disk (a copy: safe to serialise outside the service lock)."""
        return json.loads(json.dumps({"schema": SCHEMA, **{f.name: getattr(self, f.name) for f in fields(self)}}))

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> VideoJob:
        """The job a record describes, of this schema or an earlier one (`current_field_names`)."""
        data = current_field_names(data)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def snapshot(self) -> VideoJob:
        """A deep copy: what a reader may keep while the worker changes the original."""
        return VideoJob.from_record(self.record())

    def visible(self, now: float) -> bool:
        """False once past its retention: an expired job reads as deleted even before the sweep removes it."""
        return self.expires_at is None or self.expires_at > now

    def to_object(self, *, content_url: str | None = None, record_path: str | None = None) -> dict[str, Any]:
        """The OpenAI-style video object (id, object, status, progress, ...) plus this server's extras."""
        plan = self.plan
        generated = f"{plan['width']}x{plan['height']}"
        resized = plan.get("output_width") is not None
        size = f"{plan['output_width']}x{plan['output_height']}" if resized else generated
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "video",
            "status": self.status,
            "progress": self.progress,
            "stage": self.current_stage(),  # queued | starting, denoising, decoding, muxing, publishing | the end
            "created_at": int(self.created_at),
            "completed_at": int(self.finished_at) if self.status == "completed" and self.finished_at else None,
            "expires_at": int(self.expires_at) if self.expires_at is not None else None,
            "model": self.model,
            "prompt": self.prompt,
            "size": size,
            "seconds": f"{self.job_request['seconds']:g}",
            "error": self.error,
            # extras
            "generated_size": generated,  # what the model made; differs from size when the clip was resized
            "resize": RESIZE_METHOD if resized else None,
            "fps": plan["fps"],
            "frames": plan["frames"],
            "duration_s": plan["duration_s"],
            "dit_calls": plan["dit_calls"],
            "num_inference_steps": self.job_request["steps"],
            "seed": self.job_request["seed"],
            "attempts": self.attempts,
            "worker": self.worker,
            "task": self.job_request.get("task", "t2va"),
        }
        if self.job_request.get("preset"):
            obj["preset"] = self.job_request["preset"]
        for name in GUIDANCE_FIELDS:  # set only by a model with guidance, when given
            if self.job_request.get(name) is not None:
                obj[name] = self.job_request[name]
        if self.job_request.get("loras"):
            obj["loras"] = [{"name": name, "scale": scale} for name, scale in self.job_request["loras"]]
        if self.job_request.get("media"):
            obj["inputs"] = self.job_request["media"]  # summaries: role, kind, bytes, sha256, width, height
        if self.status == "completed" and self.result:
            r = self.result
            obj.update(
                inference_time_s=r["inference_time_s"],
                peak_memory_mb=round(r["peak_memory_bytes"] / 2**20, 3),
                peak_memory_kind=r["peak_memory_kind"],
                frames=r["frames"],
                duration_s=r["duration_s"],
                dit_calls=r["dit_calls"],
                dit_calls_skipped=r.get("dit_calls_skipped", 0),
                timings=self.timings(),
            )
            if r.get("audio_channels"):  # only a model that makes audio has it (RunOutcome.audio_*)
                obj["audio"] = {"channels": r["audio_channels"], "sample_rate": r["sample_rate"],
                                "samples": r["audio_samples"]}  # fmt: skip
            if content_url:
                obj["url"] = content_url
        if record_path:
            obj["metrics"] = record_path
        if self.status == "cancelled":
            obj.update(cancel_reason=self.cancel_reason, cancelled_at_step=self.cancelled_at_step)
        return obj

    def timings(self) -> dict[str, float | None]:
        queue = (self.started_at - self.created_at) if self.started_at else None
        total = (self.finished_at - self.created_at) if self.finished_at else None
        r = self.result or {}
        return {"queue_s": queue, "inference_s": r.get("inference_time_s"), "mux_s": r.get("mux_s"), "total_s": total}


class RecordFiles:
    """The embedded store's job records, one JSON file each under one directory; every write is atomic (temporary
    name, then rename). One server per directory: `load()` claims what it finds unfinished."""

    def __init__(self, output_dir: str | Path):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}  # job id -> revision on disk

    def record_path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.json"

    def save(self, record: dict[str, Any]) -> bool:
        """Write `record` (from `VideoJob.record()`) unless a newer revision is already on disk. A record that is not
        strict UTF-8 JSON raises ValueError and nothing is written."""
        job_id, revision = record["id"], record["revision"]
        text = json.dumps(record, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        data = text.encode("utf-8")  # before the lock and the file: an unencodable record never reaches the disk
        with self._lock:
            if self._written.get(job_id, -1) >= revision:
                return False
            tmp = self.dir / f".{job_id}.json.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, self.record_path(job_id))
            self._written[job_id] = revision
        return True

    def delete(self, job_id: str) -> None:
        with self._lock:
            self._written[job_id] = 1 << 62  # a late save (the worker finishing) must not resurrect it
            self.record_path(job_id).unlink(missing_ok=True)

    def load(self) -> list[VideoJob]:
        """Every readable record, oldest first; unfinished ones become failed (the restart is why)."""
        for leftover in self.dir.glob(".video_*.json.tmp"):
            leftover.unlink(missing_ok=True)
        jobs: list[VideoJob] = []
        for path in sorted(self.dir.glob("video_*.json")):
            if not JOB_ID.match(path.stem):
                continue
            try:
                job = VideoJob.from_record(json.loads(path.read_text(encoding="utf-8")))
                encode_record(job.to_object())  # it must describe itself, and encode, before it is listed
            except Exception as exc:  # noqa: BLE001 - any record we cannot serve is skipped, never fatal
                log.warning("video jobs: skipping unreadable record %s: %s: %s", path, type(exc).__name__, exc)
                continue
            if job.id != path.stem or job.status not in STATUSES:
                log.warning("video jobs: skipping inconsistent record %s", path)
                continue
            if job.status not in FINISHED:
                was = job.status
                job.status, job.finished_at = "failed", time.time()
                job.error = {
                    "code": "server_restarted",
                    "message": f"server restarted before the job finished (it was {was})",
                }
                job.touch()
                self._written.pop(job.id, None)
                self.save(job.record())
            self._written[job.id] = job.revision
            jobs.append(job)
        jobs.sort(key=lambda j: j.created_at)
        return jobs
