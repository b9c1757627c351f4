"""The `runwarden` command line (typer + rich).

Exit codes: 0 success, 1 the operation failed, 2 bad usage or bad input. Errors are
one line on stderr, never a traceback for a user error.

    common   apps, consoles, errors, client, formatting
    helpfmt  plain help pages that never cut a word (PlainTyper)
    serve    serve, demo
    targets  targets add|ls|rm
    producers  producers add|ls|rm
    launch   launch, resume
    runs     retrieve, follow, stop, cancel
    views    runs, show, logs, stops
    doctor   doctor
    check    check-trainer
    status   status (the service's health)
"""

from __future__ import annotations

import sys

from . import check, doctor, launch, producers, runs, serve, status, targets, views
from .common import app, err

__all__ = ["app", "main"]

# The command modules register their commands on `app` when imported.
_COMMANDS = (check, doctor, launch, producers, runs, serve, status, targets, views)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
