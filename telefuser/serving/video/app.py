"""The batch video service (`telefuser serve`) as a FastAPI app: OpenAI-style `/v1/videos` jobs, run one at a time.

The routes, fields, limits and errors are in PROTOCOL.md. Jobs live in a `JobStore` (embedded files by default, or
PostgreSQL shared by replicas), MP4s in an `ArtifactStore`; the lifespan starts the `VideoWorker` and, on shutdown,
stops it (the embedded store cancels what is queued or running; PostgreSQL hands the running job back). Store calls
run in the thread pool; a store that cannot be reached answers 503 with Retry-After.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from ..common.auth import ApiKeyMiddleware, ApiKeys
from ..common.http_errors import RequestError, ServerFaultMiddleware, error_response
from ..common.request_body import read_body
from .canvas import RESIZE_METHOD
from .contract import VideoPlan, VideoRunner
from .jobs import VideoJob, encode_record, new_job_id
from .limits import VideoLimitFlags, check_video_plan, derive_video_limits
from .metrics import CONTENT_TYPE, VideoMetrics
from .request import FIELDS, VideoPolicy, VideoRequest, check_plan, parse_video_request
from .store import ArtifactStore, JobStore, QueuePolicy, open_embedded
from .store.base import MissingArtifact, QueueFull, StoreUnavailable, UnknownCursor, Unstorable
from .worker import VideoWorker

log = logging.getLogger("telefuser.serving")


def create_video_app(
    runner: VideoRunner,
    *,
    output_dir: str | Path = "outputs/videos",
    max_queue: int = 16,
    max_seconds: float = 10.0,
    max_steps: int = 1000,
    max_body_bytes: int = 1 << 20,
    shutdown_timeout_s: float = 30.0,
    limits: VideoLimitFlags | None = None,
    api_keys: ApiKeys | None = None,
    job_store: JobStore | None = None,
    artifacts: ArtifactStore | None = None,
    worker_id: str | None = None,
) -> FastAPI:
    """`runner` plans and runs jobs (see contract.py). Without `job_store`/`artifacts`, jobs and MP4s live in
    `output_dir` (the embedded store, `max_queue` jobs waiting) and finished ones there are loaded at once."""
    limit_set = derive_video_limits(
        runner, max_seconds=max_seconds, max_steps=max_steps, max_body_bytes=max_body_bytes, flags=limits
    )
    policy = VideoPolicy.from_runner(
        runner, max_seconds=max_seconds, max_steps=max_steps, max_frames=limit_set.value("max_frames")
    )
    keys = api_keys or ApiKeys()
    metrics = VideoMetrics()
    if job_store is None:
        job_store, artifacts = open_embedded(output_dir, QueuePolicy(max_queue=max_queue), artifacts)
    elif artifacts is None:
        raise ValueError("a job store needs its artifact store")
    store, files = job_store, artifacts
    worker = VideoWorker(runner, store, files, metrics, worker_id=worker_id)
    started = time.time()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        worker.start()
        try:
            yield
        finally:
            cancelled = await run_in_threadpool(worker.shutdown, shutdown_timeout_s)
            await run_in_threadpool(store.close)
            log.info("video service stopped (%d job(s) cancelled)", cancelled)

    app = FastAPI(title="TeleFuser video service", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.videos = worker
    app.state.api_keys = keys
    app.add_middleware(ApiKeyMiddleware, keys=keys, public=lambda path: path == "/v1/service/health")
    app.add_middleware(ServerFaultMiddleware, logger=log)  # outermost: request ids, and a 401 gets one too

    @app.exception_handler(RequestError)
    async def request_error(_request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.detail, headers=exc.headers)

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(request: Request, exc: StoreUnavailable) -> JSONResponse:
        log.warning("%s %s: 503, %s", request.method, request.url.path, exc)
        return error_response(503, f"{exc}; retry in {exc.retry_after_s} s", retry_after=exc.retry_after_s)

    def validate(content_type: str, body: bytes) -> tuple[VideoRequest, VideoPlan]:
        parsed = parse_video_request(content_type, body, policy)
        output = parsed.spec.output_dims
        asked = output or (_dims(parsed.spec.resolution) if isinstance(parsed.spec.resolution, str) else None)
        if asked is not None:  # the size asked for, before anything is planned; the generated canvas follows
            name = "size" if "size" in parsed.fields else "resolution"
            limit_set.check_canvas(*asked, f"'{name}' {asked[0]}x{asked[1]}")
        try:
            plan = runner.plan(parsed.spec)
        except ValueError as exc:
            raise RequestError(422, str(exc)) from None
        if output is not None:
            plan = dataclasses.replace(plan, output_width=output[0], output_height=output[1])
        check_plan(parsed, plan)
        check_video_plan(limit_set, plan, runner)
        return parsed, plan

    def describe(request: Request, job: VideoJob) -> dict[str, Any]:
        url = str(request.url_for("video_content", video_id=job.id)) if job.status == "completed" else None
        return job.to_object(content_url=url, record_path=store.record_location(job.id))

    async def lookup(video_id: str) -> VideoJob:
        job = await run_in_threadpool(store.get, video_id)
        if job is None:
            raise RequestError(404, f"unknown video {video_id!r}")
        return job

    def retry_after_s() -> int:
        mean = metrics.mean_observed()
        return int(min(3600, max(1, round(mean if mean is not None else 5.0))))

    @app.post("/v1/videos")
    async def create_video(request: Request) -> JSONResponse:
        if worker.stopping:
            raise RequestError(503, "the server is shutting down")
        try:
            body = await read_body(request, max_body_bytes)
            parsed, plan = await run_in_threadpool(validate, request.headers.get("content-type", ""), body)
        except RequestError as exc:
            metrics.inc("jobs_rejected_total", reason="invalid")
            log.info("POST /v1/videos refused (%d): %s", exc.status, exc.detail)
            raise
        job = VideoJob(
            id=new_job_id(),
            model=policy.model,
            prompt=parsed.spec.prompt,
            request=parsed.fields,
            spec=parsed.spec.as_dict(),
            plan=plan.as_dict(),
        )
        try:
            stored = await run_in_threadpool(store.submit, job)
        except QueueFull as exc:
            metrics.inc("jobs_rejected_total", reason="queue_full")
            wait = retry_after_s()
            return error_response(429, f"{exc}; retry in about {wait} s", retry_after=wait)
        except Unstorable as exc:
            metrics.inc("jobs_rejected_total", reason="invalid")
            raise RequestError(422, str(exc)) from None
        metrics.inc("jobs_submitted_total")
        # The object as submitted ("queued"), even if a worker has already picked the job up.
        return JSONResponse(stored.to_object(record_path=store.record_location(job.id)))

    @app.get("/v1/videos")
    async def list_videos(request: Request, limit: int = 20, after: str | None = None, order: str = "desc"):
        if order not in ("asc", "desc") or not 1 <= limit <= 100:  # checked first: nothing is echoed back
            raise RequestError(422, "'order' must be asc or desc and 'limit' between 1 and 100")
        try:
            jobs, has_more = await run_in_threadpool(
                lambda: store.page(limit=limit, after=after, ascending=order == "asc")
            )
        except UnknownCursor:
            raise RequestError(404, f"unknown video {after!r} in 'after'") from None
        data = []
        for job in jobs:
            try:
                obj = describe(request, job)
                encode_record(obj)  # one job that cannot be sent must not take the listing down with it
            except ValueError as exc:
                log.warning("GET /v1/videos: skipping %s, whose object cannot be encoded: %s", job.id, exc)
                continue
            data.append(obj)
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }

    @app.get("/v1/videos/{video_id}")
    async def get_video(request: Request, video_id: str) -> dict[str, Any]:
        return describe(request, await lookup(video_id))

    @app.get("/v1/videos/{video_id}/content", name="video_content")
    async def video_content(video_id: str, variant: str = "video"):
        job = await lookup(video_id)
        if variant != "video":
            raise RequestError(422, f"variant {variant!r} is not available; only 'video' (the MP4 with audio)")
        if job.status != "completed":
            raise RequestError(409, f"video {video_id} is {job.status}; content exists only once it is completed")
        try:
            return await run_in_threadpool(
                lambda: files.response(video_id, filename=f"{video_id}.mp4", expires_at=job.expires_at)
            )
        except MissingArtifact as exc:
            raise RequestError(404, str(exc)) from None

    @app.delete("/v1/videos/{video_id}")
    async def delete_video(request: Request, video_id: str) -> dict[str, Any]:
        outcome = await run_in_threadpool(store.cancel, video_id, "client")
        if outcome is None:
            raise RequestError(404, f"unknown video {video_id!r}")
        result, was = outcome
        if result == "cancelled":
            metrics.inc("jobs_cancelled_total", reason="client", state=was)
        if result in ("cancelled", "busy"):
            return describe(request, await lookup(video_id))
        if not await run_in_threadpool(store.delete, video_id, files):
            raise RequestError(404, f"unknown video {video_id!r}")
        metrics.inc("jobs_deleted_total")
        return {"id": video_id, "object": "video.deleted", "deleted": True}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = {"id": policy.model, "object": "model", "created": int(started), "owned_by": "telefuser"}
        return {"object": "list", "data": [model]}

    def queue_state() -> dict[str, Any]:
        counts = store.counts()
        # The worker's own claim covers the job until its end is recorded and counted; the store's covers the moment
        # between a claim and the worker taking it up. Either way the job is neither queued nor finished.
        running = worker.running
        return {
            "queue_depth": counts["queued"],
            "max_queue": store.policy.max_queue,
            "running": running.job.id if running is not None else store.held_by(worker.worker_id),
            "replica": worker.worker_id,
            "jobs": counts,
        }

    @app.get("/v1/service/health")
    async def health() -> JSONResponse:
        if worker.stopping:
            return JSONResponse({"status": "shutting_down", "model": policy.model}, status_code=503)
        return JSONResponse({"status": "ok", "model": policy.model, **await run_in_threadpool(queue_state)})

    @app.get("/v1/service/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "service": "telefuser-video",
            "model": runner.metadata,
            "limits": {
                "max_queue": store.policy.max_queue,
                **limit_set.values(),
                "size_multiple": policy.size_multiple,
                "fps": policy.fps,
            },
            "limit_sources": limit_set.sources(),
            "sizes": {
                "multiple": policy.size_multiple,
                "off_grid": RESIZE_METHOD,
                "rule": "a size off the grid is generated at the grid canvas of nearest aspect, then resized",
            },
            "auth": {"api_key_required": keys.enabled, "scheme": "Bearer"},
            "fields": list(FIELDS),
            "defaults": policy.defaults,
            "output_dir": files.location,
            "job_store": store.location,
            "replica": worker.worker_id,
            "queue": {
                "max_attempts": store.policy.max_attempts,
                "lease_s": store.policy.lease_s,
                "retention_s": store.policy.retention_s,
            },
        }

    @app.get("/v1/service/metrics")
    async def service_metrics() -> PlainTextResponse:
        state = await run_in_threadpool(queue_state)
        gauges = [
            (
                "queue_depth",
                "Jobs waiting in the queue (all replicas), not counting running ones.",
                state["queue_depth"],
                {},
            ),
            ("queue_capacity", "Configured max_queue.", state["max_queue"], {}),
            ("jobs_running", "Jobs this replica is generating now (0 or 1).", 1 if state["running"] else 0, {}),
        ]
        gauges += [
            ("jobs", "Jobs in the job store, by status.", n, {"status": status}) for status, n in state["jobs"].items()
        ]
        return PlainTextResponse(metrics.render(gauges), media_type=CONTENT_TYPE)

    return app


def _dims(size: str) -> tuple[int, int]:
    width, height = size.lower().split("x")
    return int(width), int(height)
