"""The batch video service (`telefuser serve`) as a FastAPI app: OpenAI-style `/v1/videos` jobs, run one at a time.

The routes, fields, limits and errors are in PROTOCOL.md; they live in routes/ as routers and share one `VideoService`
(service.py) on `app.state.service`. Jobs live in a `JobStore` (embedded files by default, or PostgreSQL shared by
replicas), MP4s in an `ArtifactStore`; the lifespan starts the `VideoWorker` and, on shutdown, stops it (the embedded
store cancels what is queued or running; PostgreSQL hands the running job back). Store calls run in the thread pool; a
store that cannot be reached answers 503 with Retry-After.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ..common.auth import ApiKeys
from ..common.http_errors import error_response
from ..common.service_app import new_service_app
from .contract import VideoRunner
from .limits import VideoLimitFlags, derive_video_limits
from .lora_field import LoraPolicy
from .media import MediaLimits
from .metrics import VideoMetrics
from .request import VideoPolicy
from .routes import service as service_routes
from .routes import videos
from .service import VideoService
from .store import ArtifactStore, JobStore, QueuePolicy, open_embedded
from .store.base import StoreUnavailable
from .worker import VideoWorker

log = logging.getLogger("telefuser.serving")


def create_video_app(
    runner: VideoRunner,
    *,
    output_dir: str | Path = "outputs/videos",
    max_queue: int = 16,
    max_seconds: float = 10.0,
    max_steps: int = 1000,
    max_body_bytes: int | None = None,
    shutdown_timeout_s: float = 30.0,
    limits: VideoLimitFlags | None = None,
    api_keys: ApiKeys | None = None,
    job_store: JobStore | None = None,
    artifacts: ArtifactStore | None = None,
    worker_id: str | None = None,
    models: Sequence[str] = (),
    media_limits: MediaLimits | None = None,
    lora_policy: LoraPolicy | None = None,
) -> FastAPI:
    """`runner` plans and runs jobs (see contract.py). Without `job_store`/`artifacts`, jobs and MP4s live in
    `output_dir` (the embedded store, `max_queue` jobs waiting) and finished ones there are loaded at once. `models`:
    the models the CLI can serve, listed by /v1/service/metadata. `max_body_bytes` None: 1 MiB for a text-only
    model, room for media otherwise (limits.py); `media_limits` / `lora_policy`: what one uploaded file may be and
    how many LoRAs at which scales (the runner says whether it takes LoRAs at all)."""
    limit_set = derive_video_limits(
        runner,
        max_seconds=max_seconds,
        max_steps=max_steps,
        max_body_bytes=max_body_bytes,
        flags=limits,
        media=media_limits,
        loras=lora_policy,
    )
    max_body_bytes = int(limit_set.value("max_body_bytes"))
    policy = VideoPolicy.from_runner(
        runner,
        max_seconds=max_seconds,
        max_steps=max_steps,
        max_frames=limit_set.value("max_frames"),
        media=media_limits,
        loras=lora_policy,
    )
    if job_store is None:
        job_store, artifacts = open_embedded(output_dir, QueuePolicy(max_queue=max_queue), artifacts)
    elif artifacts is None:
        raise ValueError("a job store needs its artifact store")
    metrics = VideoMetrics()
    service = VideoService(
        runner=runner,
        policy=policy,
        limits=limit_set,
        keys=api_keys or ApiKeys(),
        metrics=metrics,
        store=job_store,
        files=artifacts,
        worker=VideoWorker(runner, job_store, artifacts, metrics, worker_id=worker_id),
        max_body_bytes=max_body_bytes,
        shutdown_timeout_s=shutdown_timeout_s,
        models=tuple(models),
    )

    app = new_service_app("TeleFuser video service", service, lifespan=_lifespan, public=_public)
    app.add_exception_handler(StoreUnavailable, _store_unavailable)
    app.include_router(videos.router)
    app.include_router(service_routes.router)
    return app


def _public(path: str) -> bool:
    """No key needed: health (what a proxy's check reads; `/health` is rewritten to it first), and `/`, which only
    redirects to the route list."""
    return path in ("/v1/service/health", "/")


@asynccontextmanager
async def _lifespan(app: FastAPI):
    service: VideoService = app.state.service
    service.worker.start()
    try:
        yield
    finally:
        cancelled = await run_in_threadpool(service.worker.shutdown, service.shutdown_timeout_s)
        await run_in_threadpool(service.store.close)
        log.info("video service stopped (%d job(s) cancelled)", cancelled)


async def _store_unavailable(request: Request, exc: StoreUnavailable) -> JSONResponse:
    log.warning("%s %s: 503, %s", request.method, request.url.path, exc)
    return error_response(503, f"{exc}; retry in {exc.retry_after_s} s", retry_after=exc.retry_after_s)
