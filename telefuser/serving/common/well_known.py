"""The paths people try first, on both services: `/health` and `/metrics` (aliases of `/v1/service/health` and
`/v1/service/metrics`) and `/docs`, a page listing every route.

`/docs` is this page rather than Swagger UI because Swagger UI loads its scripts from a CDN and the services must work
offline; the machine-readable schema stays at `/openapi.json`. An alias rewrites the path before the API-key check,
so `/health` is as public as `/v1/service/health` and `/metrics` needs a key exactly when `/v1/service/metrics` does.
"""

from __future__ import annotations

import html

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

ALIASES = {"/health": "/v1/service/health", "/metrics": "/v1/service/metrics"}
DOCS_PATH = "/docs"


class PathAliases:
    """ASGI middleware: a request for an alias is served as its target path."""

    def __init__(self, app, aliases: dict[str, str] = ALIASES):
        self.app, self.aliases = app, dict(aliases)

    async def __call__(self, scope, receive, send) -> None:
        target = self.aliases.get(scope.get("path", "")) if scope["type"] == "http" else None
        if target is not None:
            scope = {**scope, "path": target, "raw_path": target.encode()}
        await self.app(scope, receive, send)


def add_docs_page(app: FastAPI) -> None:
    """`GET /docs`: every route of `app` (method, path, the first line of its docstring), with no external assets."""

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return HTMLResponse(render_docs(request.app))


def render_docs(app: FastAPI) -> str:
    rows = []
    for path, methods in app.openapi().get("paths", {}).items():  # FastAPI's own schema: every included route
        for method, operation in methods.items():
            what = (operation.get("description") or operation.get("summary") or "").strip().splitlines()
            cells = (method.upper(), path, what[0] if what else "")
            rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    aliases = ", ".join(f"<code>{html.escape(a)}</code> = <code>{html.escape(t)}</code>" for a, t in ALIASES.items())
    title = html.escape(app.title)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:.2em 1em;font-family:monospace}</style></head>"
        f"<body><h1>{title}</h1><p>Routes (the schema: <a href='/openapi.json'>/openapi.json</a>; "
        f'aliases: {aliases}). Errors are <code>{{"error": {{"message", "type", "param", "code"}}}}</code>.'
        f"</p><table>{''.join(rows)}</table></body></html>"
    )
