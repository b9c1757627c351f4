"""The health page and its JSON twin: `/health` shows what `runwarden status` shows
(`producers.health`), refreshed every two seconds; `/api/health` is the report as
`runwarden status --json` prints it, with HTTP 200 when it is ok and 503 when
something is down (an HTTP health check). Both read Redis with bounded waits: a Redis
that is down answers within seconds, as a report that says so."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from ..health import report_rows
from .render import Web

__all__ = ["health_router"]


def health_router(web: Web) -> APIRouter:
    """The routes `/health` and `/api/health` over `web`."""
    router = APIRouter()

    @router.get("/health")
    def health(request: Request) -> Response:
        report = web.api.health()
        return web.page(
            request, "health.html", report=report, rows=report_rows(report), nav="health"
        )

    @router.get("/api/health")
    def health_json() -> Response:
        report = web.api.health()
        return JSONResponse(report.model_dump(mode="json"), status_code=200 if report.ok else 503)

    return router
