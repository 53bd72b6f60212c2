"""What the video service's routes share: one `VideoService` on `app.state.service`, reached through a dependency.

The routes (routes/) hold no state of their own; whatever they need (the runner, the limits, the stores, the worker,
the metrics) is here, with the few steps more than one route takes: validate a request, describe a job, look one up.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from ...sizes import parse_size
from ..common.auth import ApiKeys
from ..common.http_errors import RequestError
from ..common.limits import LimitSet
from .contract import VideoShape, VideoRunner
from .jobs import VideoJob
from .limits import check_video_plan
from .metrics import VideoMetrics
from .request import VideoPolicy, VideoRequest, check_plan, parse_video_request
from .store import ArtifactStore, JobStore
from .worker import VideoWorker


@dataclass
class VideoService:
    runner: VideoRunner
    policy: VideoPolicy
    limits: LimitSet
    keys: ApiKeys
    metrics: VideoMetrics
    store: JobStore
    files: ArtifactStore
    worker: VideoWorker
    max_body_bytes: int
    shutdown_timeout_s: float
    models: Sequence[str] = ()  # the models this service's CLI can serve (/v1/service/metadata)
    started: float = field(default_factory=time.time)

    def validate(self, content_type: str, body: bytes) -> tuple[VideoRequest, VideoShape]:
        """Parse and plan a POST /v1/videos body; RequestError (4xx) when it cannot run here."""
        parsed = parse_video_request(content_type, body, self.policy)
        job_request = parsed.job_request
        output = job_request.output_dims
        asked = output or (parse_size(job_request.resolution) if isinstance(job_request.resolution, str) else None)
        if asked is not None:  # the size asked for, before anything is planned; the generated canvas follows
            name = "size" if "size" in parsed.fields else "resolution"
            self.limits.check_canvas(*asked, f"'{name}' {asked[0]}x{asked[1]}")
        try:
            plan = self.runner.plan(job_request)
        except ValueError as exc:
            raise RequestError(422, str(exc)) from None
        if output is not None:
            plan = dataclasses.replace(plan, output_width=output[0], output_height=output[1])
        check_plan(parsed, plan)
        check_video_plan(self.limits, plan, self.runner)
        return parsed, plan

    def describe(self, request: Request, job: VideoJob) -> dict[str, Any]:
        """The job's OpenAI video object, with its content URL once it is completed."""
        url = str(request.url_for("video_content", video_id=job.id)) if job.status == "completed" else None
        return job.to_object(content_url=url, record_path=self.store.record_location(job.id))

    async def lookup(self, video_id: str) -> VideoJob:
        job = await run_in_threadpool(self.store.get, video_id)
        if job is None:
            raise RequestError(404, f"unknown video {video_id!r}")
        return job

    def retry_after_s(self) -> int:
        """What a 429 tells the client to wait: about one job's mean time."""
        mean = self.metrics.mean_observed()
        return int(min(3600, max(1, round(mean if mean is not None else 5.0))))

    def queue_state(self) -> dict[str, Any]:
        """Queue depth, capacity, this replica's running job and the store's counts (a store call: thread pool)."""
        counts = self.store.counts()
        # The worker's own claim covers the job until its end is recorded and counted; the store's covers the moment
        # between a claim and the worker taking it up. Either way the job is neither queued nor finished.
        running = self.worker.running
        return {
            "queue_depth": counts["queued"],
            "max_queue": self.store.policy.max_queue,
            "running": running.job.id if running is not None else self.store.held_by(self.worker.worker_id),
            "replica": self.worker.worker_id,
            "jobs": counts,
        }


def video_service(connection: HTTPConnection) -> VideoService:
    return connection.app.state.service


# A route parameter typed `Service` receives the app's `VideoService`; it adds nothing to the OpenAPI schema.
Service = Annotated[VideoService, Depends(video_service)]
