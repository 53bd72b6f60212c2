"""The batch video service (`telefuser serve`) as a FastAPI app: OpenAI-style `/v1/videos` jobs, run one at a time.

The routes, fields, limits and errors are in PROTOCOL.md. All state is the `VideoQueue` on `app.state.videos`; the
lifespan starts its worker thread and, on shutdown, cancels what is queued or running and waits for the worker.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from ..common.auth import ApiKeyMiddleware, ApiKeys
from ..common.http_errors import RequestError, ServerFaultMiddleware, error_response
from ..common.request_body import read_body
from .canvas import RESIZE_METHOD
from .contract import VideoPlan, VideoRunner
from .jobs import JobStore, VideoJob, encode_record, new_job_id
from .limits import VideoLimitFlags, check_video_plan, derive_video_limits
from .metrics import CONTENT_TYPE, VideoMetrics
from .request import FIELDS, VideoPolicy, VideoRequest, check_plan, parse_video_request
from .worker import QueueFull, ShuttingDown, Unstorable, VideoQueue

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
) -> FastAPI:
    """`runner` plans and runs jobs (see contract.py); finished jobs in `output_dir` are loaded at once."""
    limit_set = derive_video_limits(
        runner, max_seconds=max_seconds, max_steps=max_steps, max_body_bytes=max_body_bytes, flags=limits
    )
    policy = VideoPolicy.from_runner(
        runner, max_seconds=max_seconds, max_steps=max_steps, max_frames=limit_set.value("max_frames")
    )
    keys = api_keys or ApiKeys()
    metrics = VideoMetrics()
    queue = VideoQueue(runner, JobStore(output_dir), metrics, max_queue=max_queue)
    started = time.time()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        queue.start()
        try:
            yield
        finally:
            cancelled = await run_in_threadpool(queue.shutdown, shutdown_timeout_s)
            log.info("video service stopped (%d job(s) cancelled)", cancelled)

    app = FastAPI(title="TeleFuser video service", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.videos = queue
    app.state.api_keys = keys
    app.add_middleware(ApiKeyMiddleware, keys=keys, public=lambda path: path == "/v1/service/health")
    app.add_middleware(ServerFaultMiddleware, logger=log)  # outermost: request ids, and a 401 gets one too

    @app.exception_handler(RequestError)
    async def request_error(_request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.detail, headers=exc.headers)

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

    def describe(request: Request, job_id: str) -> dict[str, Any]:
        status = queue.status_of(job_id)
        if status is None:
            raise RequestError(404, f"unknown video {job_id!r}")
        url = str(request.url_for("video_content", video_id=job_id)) if status == "completed" else None
        obj = queue.describe(job_id, content_url=url, record_path=str(queue.store.record_path(job_id)))
        if obj is None:  # deleted between the two reads
            raise RequestError(404, f"unknown video {job_id!r}")
        return obj

    @app.post("/v1/videos")
    async def create_video(request: Request) -> JSONResponse:
        if queue.stopping:
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
            record = await run_in_threadpool(queue.submit, job)  # writes the queued record
        except QueueFull as exc:
            return error_response(429, str(exc), retry_after=exc.retry_after_s)
        except ShuttingDown as exc:
            raise RequestError(503, str(exc)) from None
        except Unstorable as exc:
            metrics.inc("jobs_rejected_total", reason="invalid")
            raise RequestError(422, str(exc)) from None
        # The object as submitted ("queued"), even if the worker has already picked the job up.
        return JSONResponse(VideoJob.from_record(record).to_object(record_path=str(queue.store.record_path(job.id))))

    @app.get("/v1/videos")
    async def list_videos(request: Request, limit: int = 20, after: str | None = None, order: str = "desc"):
        if order not in ("asc", "desc") or not 1 <= limit <= 100:  # checked first: nothing is echoed back
            raise RequestError(422, "'order' must be asc or desc and 'limit' between 1 and 100")
        ids = queue.list_ids()
        ids = ids if order == "asc" else ids[::-1]
        if after is not None:
            if after not in ids:
                raise RequestError(404, f"unknown video {after!r} in 'after'")
            ids = ids[ids.index(after) + 1 :]
        data = []
        for job_id in ids[:limit]:
            try:
                obj = describe(request, job_id)
                encode_record(obj)  # one job that cannot be sent must not take the listing down with it
            except RequestError:  # deleted meanwhile
                continue
            except ValueError as exc:
                log.warning("GET /v1/videos: skipping %s, whose object cannot be encoded: %s", job_id, exc)
                continue
            data.append(obj)
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(ids) > limit,
        }

    @app.get("/v1/videos/{video_id}")
    async def get_video(request: Request, video_id: str) -> dict[str, Any]:
        return describe(request, video_id)

    @app.get("/v1/videos/{video_id}/content", name="video_content")
    async def video_content(video_id: str, variant: str = "video") -> FileResponse:
        status = queue.status_of(video_id)
        if status is None:
            raise RequestError(404, f"unknown video {video_id!r}")
        if variant != "video":
            raise RequestError(422, f"variant {variant!r} is not available; only 'video' (the MP4 with audio)")
        if status != "completed":
            raise RequestError(409, f"video {video_id} is {status}; content exists only once it is completed")
        path = queue.store.video_path(video_id)
        if not path.is_file():
            raise RequestError(404, f"the file of video {video_id} is missing from the output directory")
        return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")

    @app.delete("/v1/videos/{video_id}")
    async def delete_video(request: Request, video_id: str) -> dict[str, Any]:
        outcome = await run_in_threadpool(queue.cancel, video_id, "client")
        if outcome is None:
            raise RequestError(404, f"unknown video {video_id!r}")
        if outcome in ("cancelled", "busy"):
            return describe(request, video_id)
        if not await run_in_threadpool(queue.delete, video_id):
            raise RequestError(404, f"unknown video {video_id!r}")
        return {"id": video_id, "object": "video.deleted", "deleted": True}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = {"id": policy.model, "object": "model", "created": int(started), "owned_by": "telefuser"}
        return {"object": "list", "data": [model]}

    @app.get("/v1/service/health")
    async def health() -> JSONResponse:
        body = {"status": "shutting_down" if queue.stopping else "ok", "model": policy.model, **queue.counts()}
        return JSONResponse(body, status_code=503 if queue.stopping else 200)

    @app.get("/v1/service/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "service": "telefuser-video",
            "model": runner.metadata,
            "limits": {
                "max_queue": max_queue,
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
            "output_dir": str(queue.store.dir),
        }

    @app.get("/v1/service/metrics")
    async def service_metrics() -> PlainTextResponse:
        counts = queue.counts()
        gauges = [
            ("queue_depth", "Jobs waiting in the queue (not counting the running one).", counts["queue_depth"], {}),
            ("queue_capacity", "Configured max_queue.", queue.max_queue, {}),
            ("jobs_running", "Jobs being generated now (0 or 1).", 1 if counts["running"] else 0, {}),
        ]
        gauges += [
            ("jobs", "Jobs known to the server, by status.", n, {"status": status})
            for status, n in counts["jobs"].items()
        ]
        return PlainTextResponse(metrics.render(gauges), media_type=CONTENT_TYPE)

    return app


def _dims(size: str) -> tuple[int, int]:
    width, height = size.lower().split("x")
    return int(width), int(height)
