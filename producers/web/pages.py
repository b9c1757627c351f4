"""The HTML pages and the two actions (stop, cancel), each with a confirmation step.

A POST is acted on only when it comes from a page of this server (same origin) and
carries a valid CSRF token; its first submission renders a confirmation page, and
only the confirmed one publishes (`api.stop(..., asked_by="web")`, `api.cancel`),
exactly as the CLI does. A refused operation is shown on the run page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from fastapi import APIRouter, HTTPException, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from schemas import (
    Conflict,
    NoSnapshots,
    NotFound,
    NotRunning,
    NotStarted,
    RunError,
    SnapshotReason,
    StoreError,
    validate_run_id,
)

from ..api import OperationFailed
from .render import Web
from .security import BadForm, cross_site, read_form
from .views import LOG_LINES, RUNS_SHOWN, run_rows, run_view

__all__ = ["page_router"]

_NOTICES: Final = {
    "stop": "Snapshot asked: the job saves a checkpoint at the end of its current step, "
    "then ends. The stop is followed below.",
    "cancel": "Cancelled: the job was ended without a snapshot.",
}
_REFUSED: Final = (NotStarted, NotRunning, NoSnapshots, Conflict)


def _status_of(error: RunError) -> int:
    """The HTTP status of a failed operation: 409 when the run's state refuses it,
    502 when the worker failed or did not answer, 503 when the store failed."""
    if isinstance(error, _REFUSED):
        return 409
    if isinstance(error, OperationFailed):
        return 502
    if isinstance(error, StoreError):
        return 503
    return 409


def page_router(web: Web) -> APIRouter:
    """The routes of the pages, over `web`."""
    router = APIRouter()

    def run_page(
        request: Request,
        run_id: str,
        *,
        notice: str | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        view = run_view(web.api, run_id)
        return web.page(
            request, "run.html", status, view=view, notice=notice, error=error,
            log_lines=LOG_LINES,
        )  # fmt: skip

    async def checked_form(request: Request) -> Mapping[str, str]:
        why = cross_site(request)
        if why is not None:
            raise HTTPException(403, f"refused: {why}")
        try:
            form = await read_form(request)
        except BadForm as error:
            raise HTTPException(error.status, str(error)) from error
        if not web.csrf.valid(form.get("csrf")):
            raise HTTPException(
                403, "refused: the form's token is missing or expired; reload the page and retry"
            )
        return form

    async def act(request: Request, run_id: str, action: str, form: Mapping[str, str]) -> Response:
        reason = SnapshotReason.REQUESTED
        if action == "stop":
            try:
                reason = SnapshotReason(form.get("reason", "requested"))
            except ValueError as error:
                names = ", ".join(r.value for r in SnapshotReason)
                raise HTTPException(400, f"unknown reason: use one of {names}") from error
        if form.get("confirmed") != "yes":
            run = await run_in_threadpool(web.api.get_run, run_id)
            progress = await run_in_threadpool(web.api.store.follow.last_metrics, run_id)
            # The timeouts the stop would get (a stop already open keeps its own).
            # Decided by the rule of the workers' settings, as they will decide it.
            budget, _ = await run_in_threadpool(web.api.next_stop_budget, run)
            return web.page(
                request, "confirm.html", action=action, run=run, progress=progress,
                reason=reason, proof_timeout_s=budget.proof_timeout_s,
                end_timeout_s=budget.end_timeout_s, budget=budget,
            )  # fmt: skip
        try:
            if action == "stop":
                await run_in_threadpool(lambda: web.api.stop(run_id, reason, asked_by="web"))
            else:
                await run_in_threadpool(web.api.cancel, run_id)
        except NotFound:
            raise
        except RunError as error:
            message = f"{action} refused: {' '.join(str(error).split())}"
            status = _status_of(error)
            return await run_in_threadpool(
                lambda: run_page(request, run_id, error=message, status=status)
            )
        return RedirectResponse(f"/runs/{run_id}?notice={action}", status_code=303)

    @router.get("/")
    def runs(request: Request) -> Response:
        return web.page(request, "runs.html", rows=run_rows(web.api), shown=RUNS_SHOWN, nav="runs")

    @router.get("/stops")
    def stops(request: Request) -> Response:
        return web.page(request, "stops.html", stops=web.api.list_stops(), nav="stops")

    @router.get("/runs/{run_id}")
    def run(request: Request, run_id: str, notice: str | None = None) -> Response:
        return run_page(request, run_id, notice=_NOTICES.get(notice or ""))

    @router.post("/runs/{run_id}/stop")
    async def stop(request: Request, run_id: str) -> Response:
        form = await checked_form(request)
        return await act(request, validate_run_id(run_id), "stop", form)

    @router.post("/runs/{run_id}/cancel")
    async def cancel(request: Request, run_id: str) -> Response:
        form = await checked_form(request)
        return await act(request, validate_run_id(run_id), "cancel", form)

    return router
