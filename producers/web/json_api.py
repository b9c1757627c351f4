"""The JSON twins of the pages, for scripts: the records as the store holds them
(`model_dump(mode="json")`, as `runwarden ... --json` prints them), and the log
tail the run page's script reads on from (display-ready: cleaned and cut).

Errors are `{"error": message}` with the status of the pages (400, 404, 503)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from schemas import validate_run_id

from .render import Web
from .views import LOG_LINES, check_entry_id, tail_log

__all__ = ["json_router"]


def json_router(web: Web) -> APIRouter:
    """The `/api/...` routes over `web`."""
    router = APIRouter(prefix="/api")

    @router.get("/runs")
    def runs() -> list[dict[str, Any]]:
        """Every run, newest first."""
        return [run.model_dump(mode="json") for run in web.api.list_runs()]

    @router.get("/runs/{run_id}")
    def run(run_id: str) -> dict[str, Any]:
        """One run's record."""
        return web.api.get_run(validate_run_id(run_id)).model_dump(mode="json")

    @router.get("/runs/{run_id}/log")
    def log(run_id: str, after: str = "0-0") -> dict[str, Any]:
        """The last lines of the run's log after entry `after` (at most the run
        page's count), cleaned of control sequences and cut, and the id to read on
        from: `{"lines": [{"id", "line"}], "last": id}`."""
        run = web.api.get_run(validate_run_id(run_id))
        try:
            check_entry_id(after)
        except ValueError as error:
            raise HTTPException(400, str(error)) from error
        lines, last = tail_log(web.api, run.id, after=after, keep=LOG_LINES)
        return {"lines": [{"id": line.id, "line": line.text} for line in lines], "last": last}

    @router.get("/stops")
    def stops() -> list[dict[str, Any]]:
        """Every stop in flight, oldest request first."""
        return [stop.model_dump(mode="json") for stop in web.api.list_stops()]

    return router
