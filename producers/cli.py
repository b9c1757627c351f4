"""The `runwarden` command line (typer + rich).

Exit codes: 0 success, 1 the operation failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import subprocess
import sys

import typer

__all__ = ["app", "main"]

app = typer.Typer(
    name="runwarden",
    help="Run long training jobs on local or SSH targets and stop them gracefully.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Run long training jobs on local or SSH targets and stop them gracefully."""


@app.command()
def demo() -> None:
    """Launch the toy trainer on this machine, stop it with a snapshot, show the outcome."""
    # The demo drives executors, which live in `workers`; this package never imports
    # it, so the demo runs as its own process.
    code = subprocess.call([sys.executable, "-m", "workers.demo"])
    raise typer.Exit(code)


def main() -> None:
    """Console-script entry point."""
    app()
