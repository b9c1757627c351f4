"""Rendering: the Jinja environment of the templates (package data under
`producers/web/templates/`) and [`Web`], what every route shares: the API, the CSRF
tokens, the Flower address, and the page / error responses.

Every value a template prints goes through [`clean_text`] (Jinja's `finalize`) and then
Jinja's autoescape: job-written text reaches the page without terminal escapes,
control characters or markup, wherever a template prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.templating import Jinja2Templates

from schemas import SnapshotReason
from schemas.text import clean_text, duration_text, format_bytes

from ..api import Runwarden
from .security import CsrfTokens
from .text import left_text, utc_text

__all__ = ["Web", "make_environment"]


def _finalize(value: object) -> object:
    # Markup is already-rendered HTML of our own templates (macro output).
    if isinstance(value, str) and not isinstance(value, Markup):
        return clean_text(value)
    return value


def _left(deadline: datetime, now: datetime) -> str:
    return left_text((deadline - now).total_seconds())


def make_environment() -> jinja2.Environment:
    """The templates' environment: autoescape on for every template, every printed
    value cleaned, undefined names an error (a template typo fails its test)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("producers.web", "templates"),
        autoescape=True,
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["utc"] = utc_text
    env.filters["size"] = format_bytes
    env.filters["duration"] = duration_text
    env.filters["left"] = _left
    return env


@dataclass
class Web:
    """What the routes share. `flower_url` has no trailing slash."""

    api: Runwarden
    csrf: CsrfTokens
    flower_url: str | None
    templates: Jinja2Templates

    @classmethod
    def build(cls, api: Runwarden, flower_url: str | None) -> Web:
        return cls(api, CsrfTokens(), flower_url, Jinja2Templates(env=make_environment()))

    def page(self, request: Request, name: str, status: int = 200, **values: Any) -> Response:
        """Template `name` rendered with `values` and what every page uses: `now`
        (UTC), a fresh CSRF token, the Flower address, the snapshot reasons."""
        context = {
            "now": datetime.now(UTC),
            "csrf": self.csrf.issue(),
            "flower_url": self.flower_url,
            "reasons": list(SnapshotReason),
            "nav": "",
            **values,
        }
        return self.templates.TemplateResponse(request, name, context, status_code=status)

    def error(self, request: Request, status: int, title: str, message: str) -> Response:
        """An error answer: JSON `{"error": message}` under `/api/`, else the error page."""
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=status)
        return self.page(request, "error.html", status, title=title, message=message)
