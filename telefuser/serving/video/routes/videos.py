"""`/v1/videos`: submit a job, list, read, download and cancel or delete jobs (PROTOCOL.md)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ...common.http_errors import RequestError, error_response
from ...common.request_body import read_body
from ..jobs import VideoJob, encode_record, new_job_id
from ..service import Service
from ..store.base import MissingArtifact, QueueFull, UnknownCursor, Unstorable

log = logging.getLogger("telefuser.serving")
router = APIRouter()


@router.post("/v1/videos")
async def create_video(request: Request, service: Service) -> JSONResponse:
    """Queue a job (JSON or multipart: prompt, size, seconds, ...; PROTOCOL.md); the video object, status queued."""
    if service.worker.stopping:
        raise RequestError(503, "the server is shutting down")
    metrics, store = service.metrics, service.store
    try:
        body = await read_body(request, service.max_body_bytes)
        parsed, plan = await run_in_threadpool(service.validate, request.headers.get("content-type", ""), body)
    except RequestError as exc:
        metrics.inc("jobs_rejected_total", reason="invalid")
        log.info("POST /v1/videos refused (%d): %s", exc.status, exc.detail)
        raise
    job = VideoJob(
        id=new_job_id(),
        model=service.policy.model,
        prompt=parsed.job_request.prompt,
        request=parsed.fields,
        job_request=parsed.job_request.as_dict(),
        plan=plan.as_dict(),
    )
    media = parsed.job_request.media_data()
    if media:  # staged before the job is queued: whichever replica claims it finds them
        await run_in_threadpool(service.files.put_inputs, job.id, media)
    try:
        stored = await run_in_threadpool(store.submit, job)
    except QueueFull as exc:
        metrics.inc("jobs_rejected_total", reason="queue_full")
        await _unstage(service, job.id, media)
        wait = service.retry_after_s()
        return error_response(429, f"{exc}; retry in about {wait} s", retry_after=wait)
    except Unstorable as exc:
        metrics.inc("jobs_rejected_total", reason="invalid")
        await _unstage(service, job.id, media)
        raise RequestError(422, str(exc)) from None
    except BaseException:
        await _unstage(service, job.id, media)
        raise
    metrics.inc("jobs_submitted_total")
    # The object as submitted ("queued"), even if a worker has already picked the job up.
    return JSONResponse(stored.to_object(record_path=store.record_location(job.id)))


@router.get("/v1/videos")
async def list_videos(
    request: Request, service: Service, limit: int = 20, after: str | None = None, order: str = "desc"
):
    """Jobs, newest first (`order`, `after`, `limit`)."""
    if order not in ("asc", "desc") or not 1 <= limit <= 100:  # checked first: nothing is echoed back
        raise RequestError(422, "'order' must be asc or desc and 'limit' between 1 and 100")
    try:
        jobs, has_more = await run_in_threadpool(
            lambda: service.store.page(limit=limit, after=after, ascending=order == "asc")
        )
    except UnknownCursor:
        raise RequestError(404, f"unknown video {after!r} in 'after'") from None
    data = []
    for job in jobs:
        try:
            obj = service.describe(request, job)
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


@router.get("/v1/videos/{video_id}")
async def get_video(request: Request, video_id: str, service: Service) -> dict[str, Any]:
    """One job: status, progress, stage, and once completed its timings and url."""
    return service.describe(request, await service.lookup(video_id))


@router.get("/v1/videos/{video_id}/content", name="video_content")
async def video_content(video_id: str, service: Service, variant: str = "video"):
    """The MP4 (H.264, + AAC where the model makes audio) of a completed job; 409 before then."""
    job = await service.lookup(video_id)
    if variant != "video":
        raise RequestError(422, f"variant {variant!r} is not available; only 'video' (the MP4)")
    if job.status != "completed":
        raise RequestError(409, f"video {video_id} is {job.status}; content exists only once it is completed")
    try:
        return await run_in_threadpool(
            lambda: service.files.response(video_id, filename=f"{video_id}.mp4", expires_at=job.expires_at)
        )
    except MissingArtifact as exc:
        raise RequestError(404, str(exc)) from None


@router.delete("/v1/videos/{video_id}")
async def delete_video(request: Request, video_id: str, service: Service) -> dict[str, Any]:
    """Cancel a queued or running job; delete a finished one with its MP4."""
    # A queued or running job is cancelled (and its object answered); a finished one is deleted with its MP4.
    store = service.store
    outcome = await run_in_threadpool(store.cancel, video_id, "client")
    if outcome is None:
        raise RequestError(404, f"unknown video {video_id!r}")
    result, was = outcome
    if result == "cancelled":
        service.metrics.inc("jobs_cancelled_total", reason="client", state=was)
    if result in ("cancelled", "busy"):
        return service.describe(request, await service.lookup(video_id))
    if not await run_in_threadpool(store.delete, video_id, service.files):
        raise RequestError(404, f"unknown video {video_id!r}")
    service.metrics.inc("jobs_deleted_total")
    return {"id": video_id, "object": "video.deleted", "deleted": True}


async def _unstage(service, job_id: str, media: list[bytes]) -> None:
    """A job that was not queued leaves no staged media behind."""
    if media:
        await run_in_threadpool(service.files.delete_inputs, job_id)
