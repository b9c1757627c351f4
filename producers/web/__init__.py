"""A server-rendered web view of runs and stops in flight, for people: FastAPI,
Jinja2 templates, uvicorn, and one small static script for countdowns and refresh.

    from producers.api import Runwarden
    from producers.web import serve
    serve(Runwarden(), port=8350, user="ops", password=...)  # http://127.0.0.1:8350/

It reads and publishes through `producers.api.Runwarden` only (a producer: it never
imports `workers`). See `app.create_app` for the pages and their guarantees, and
`server.serve` for serving.
"""

from __future__ import annotations

from .app import create_app
from .server import DEFAULT_PORT, make_server, serve

__all__ = ["DEFAULT_PORT", "create_app", "make_server", "serve"]
