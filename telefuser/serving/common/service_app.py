"""The FastAPI app both services start from; each adds its routers (its routes/ package) and nothing else.

The pattern: a service's shared state is one object on `app.state.service`, which its routes receive through a
dependency (the service's `service.py`); no route is a closure. The API keys are also on `app.state.api_keys`, where
the launcher reads them to warn about an open port (launch.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from .auth import ApiKeyMiddleware
from .http_errors import (
    RequestError,
    ServerFaultMiddleware,
    answer_http_exception,
    answer_request_error,
    answer_validation_error,
)
from .well_known import ALIASES, DOCS_PATH, PathAliases, add_docs_page

log = logging.getLogger("telefuser.serving")


def new_service_app(
    title: str,
    service: Any,
    *,
    lifespan: Callable,
    public: Callable[[str], bool],
    query_token_ok: Callable[[str, str], bool] | None = None,
    inner_middleware: tuple[tuple[type, dict[str, Any]], ...] = (),
) -> FastAPI:
    """`service`: the routes' shared state, with the service's `keys` (ApiKeys). `public(path)`: paths that need no
    key (`/docs` needs none either). `inner_middleware`: (class, options) that run after the request id is set and
    before the key is checked, outermost first. Every error is answered in one shape (http_errors.py), and `/health`,
    `/metrics` and `/docs` answer (well_known.py)."""
    # /docs is our own page (well_known.py): Swagger UI would load from a CDN, and the services must work offline.
    app = FastAPI(title=title, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    app.state.api_keys = service.keys
    app.add_middleware(
        ApiKeyMiddleware, keys=service.keys, public=lambda p: p == DOCS_PATH or public(p), query_token_ok=query_token_ok
    )
    for middleware, options in reversed(inner_middleware):
        app.add_middleware(middleware, **options)
    app.add_middleware(PathAliases, aliases=ALIASES)  # before the key check: an alias is as public as its target
    app.add_middleware(ServerFaultMiddleware, logger=log)  # outermost: request ids, and a 401 gets one too
    app.add_exception_handler(RequestError, answer_request_error)
    app.add_exception_handler(HTTPException, answer_http_exception)
    app.add_exception_handler(RequestValidationError, answer_validation_error)
    add_docs_page(app)
    return app
