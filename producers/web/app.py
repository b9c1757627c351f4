"""The web view's application: [`create_app`] builds it over one `Runwarden`.

Pages: `/` (runs, newest first), `/runs/{run_id}` (one run: record, progress, open
stop with countdowns, stop history, ledger, log tail, Stop and Cancel), `/stops` (stops in
flight with live countdowns). JSON for scripts: `/api/runs`, `/api/runs/{run_id}`,
`/api/runs/{run_id}/log`, `/api/stops`. Static files under `/static/`.

Errors: an invalid run id is 400, an unknown run or path 404, a POST that is not
same-origin or lacks a valid CSRF token 403, a failed store 503; pages answer with
the error page, `/api/` with `{"error": message}`. No stack trace is ever shown.

The service's health: `/health`, and `/api/health` (503 when something is down), in
`health.py`.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.responses import Response

from schemas import InvalidRunId, NotFound, RunError, StoreError
from schemas.text import error_line

from ..api import Runwarden
from .health import health_router
from .json_api import json_router
from .pages import page_router
from .render import Web
from .security import BasicAuth, SecurityHeaders

__all__ = ["create_app"]

_STATIC = Path(__file__).resolve().parent / "static"
_TITLES = {400: "Bad request", 403: "Refused", 404: "Not found", 405: "Method not allowed",
           413: "Too large", 415: "Unsupported form", 503: "Store unavailable"}  # fmt: skip


def _check_flower_url(url: str | None) -> str | None:
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"flower_url must be an http(s) URL, not {url[:100]!r}")
    return url.rstrip("/")


def create_app(
    api: Runwarden, *, user: str, password: str, flower_url: str | None = None
) -> FastAPI:
    """The web view over `api`, every request behind HTTP basic auth with `user` and
    `password` (compared in constant time; 401 with a `WWW-Authenticate` challenge
    otherwise). With `flower_url` (Flower's base address, http or https), the pages
    link to Flower's tasks page.

    It reads runs and stops through `api` and its store's `Runs.find`,
    `Follow.last_metrics`, `Follow.read_log`, `Stops.history` and `ledger_history`, and publishes
    through `api.stop` and `api.cancel`: it needs the same Redis as the service,
    and a worker for the actions. Route handlers are synchronous where they call
    the API (FastAPI runs them in its thread pool).

    Raises:
        ValueError: an empty user or password, a user holding `:`, or a `flower_url`
            that is not an http(s) URL.
    """
    web = Web.build(api, _check_flower_url(flower_url))
    app = FastAPI(
        title="runwarden",
        # The generated docs pages load their scripts from a CDN: off.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.include_router(page_router(web))
    app.include_router(json_router(web))
    app.include_router(health_router(web))
    app.mount("/static", StaticFiles(directory=_STATIC), name="static")
    _add_error_handlers(app, web)
    # The last one added runs first: headers on every answer, the 401s included.
    app.add_middleware(BasicAuth, user=user, password=password)
    app.add_middleware(SecurityHeaders)
    return app


def _add_error_handlers(app: FastAPI, web: Web) -> None:
    @app.exception_handler(InvalidRunId)
    def invalid_run_id(request: Request, error: Exception) -> Response:
        return web.error(request, 400, "Bad request", error_line(error))

    @app.exception_handler(NotFound)
    def not_found(request: Request, error: Exception) -> Response:
        return web.error(request, 404, "Not found", error_line(error))

    @app.exception_handler(StoreError)
    def store_error(request: Request, error: Exception) -> Response:
        return web.error(request, 503, "Store unavailable", error_line(error))

    @app.exception_handler(RunError)
    def run_error(request: Request, error: Exception) -> Response:
        return web.error(request, 409, "Refused", error_line(error))

    @app.exception_handler(RequestValidationError)
    def bad_request(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        message = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in error.errors()
        )
        return web.error(request, 400, "Bad request", message or "bad request")

    @app.exception_handler(HTTPException)
    def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        message = error.detail if error.status_code != 404 else f"no page {request.url.path}"
        response = web.error(
            request, error.status_code, _TITLES.get(error.status_code, "Error"), str(message)
        )
        for name, value in (error.headers or {}).items():
            response.headers[name] = value
        return response
