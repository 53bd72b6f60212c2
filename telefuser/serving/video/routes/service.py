"""What the video service says about itself: `/v1/models`, `/v1/service/{health,metadata,metrics}` (also at
`/health` and `/metrics`: common/well_known.py), and `/`, which sends a browser to the route list at `/docs`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from ..canvas import RESIZE_METHOD
from ..metrics import CONTENT_TYPE
from ..request import FIELDS
from ..service import Service

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> RedirectResponse:
    return RedirectResponse("/docs")


@router.get("/v1/models")
async def models(service: Service) -> dict[str, Any]:
    """The one model this server serves (OpenAI's list shape)."""
    model = {"id": service.policy.model, "object": "model", "created": int(service.started), "owned_by": "telefuser"}
    return {"object": "list", "data": [model]}


@router.get("/v1/service/health")
async def health(service: Service) -> JSONResponse:
    """ok (200) or shutting_down (503), the model (`fake`: true for a test-pattern model), the queue."""
    model, fake = service.policy.model, bool(service.runner.metadata.get("fake"))
    if service.worker.stopping:
        return JSONResponse({"status": "shutting_down", "model": model, "fake": fake}, status_code=503)
    state = await run_in_threadpool(service.queue_state)
    return JSONResponse({"status": "ok", "model": model, "fake": fake, **state})


@router.get("/v1/service/metadata")
async def metadata(service: Service) -> dict[str, Any]:
    """The model, the limits and where each came from, the fields a request may send, the defaults."""
    policy, store = service.policy, service.store
    return {
        "service": "telefuser-video",
        "model": service.runner.metadata,
        "models": list(service.models),
        "limits": {
            "max_queue": store.policy.max_queue,
            **service.limits.values(),
            "size_multiple": policy.size_multiple,
            "fps": policy.fps,
        },
        "limit_sources": service.limits.sources(),
        "sizes": {
            "multiple": policy.size_multiple,
            "off_grid": RESIZE_METHOD,
            "rule": "a size off the grid is generated at the grid canvas of nearest aspect, then resized",
        },
        "auth": {"api_key_required": service.keys.enabled, "scheme": "Bearer"},
        "fields": list(FIELDS),
        "loras": _lora_names(service),
        "defaults": policy.defaults,
        "output_dir": service.files.location,
        "job_store": store.location,
        "replica": service.worker.worker_id,
        "queue": {
            "max_attempts": store.policy.max_attempts,
            "lease_s": store.policy.lease_s,
            "retention_s": store.policy.retention_s,
        },
    }


@router.get("/v1/service/metrics")
async def service_metrics(service: Service) -> PlainTextResponse:
    """Prometheus text: jobs by outcome, the queue, inference seconds."""
    state = await run_in_threadpool(service.queue_state)
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
    return PlainTextResponse(service.metrics.render(gauges), media_type=CONTENT_TYPE)


def _lora_names(service) -> list[str] | None:
    """The names a request's 'lora' may give (the files of --lora-dir now); None: this server takes no LoRAs."""
    library = getattr(service.runner, "loras", None)
    return library.names() if library is not None else None
