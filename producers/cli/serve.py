"""`runwarden serve` (the service in the foreground) and `runwarden demo`."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from schemas import Settings

from ..demo import run_demo
from ..embedded import NotServing
from ..service import Service, ServiceOptions
from ..web import DEFAULT_PORT as DEFAULT_WEB_PORT
from .common import app, fail, out

__all__ = ["demo", "serve"]


@app.command()
def serve(
    concurrency: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=1,
            max=64,
            help="Processes of the worker that runs stops, launches and the watch (1-64).",
        ),
    ] = 2,
    flower: Annotated[
        bool,
        typer.Option(
            "--flower/--no-flower",
            help="Also run Flower on 127.0.0.1, behind basic auth (default: no-flower).",
            show_default=False,
        ),
    ] = False,
    flower_port: Annotated[
        int, typer.Option(metavar="PORT", min=1, max=65535, help="Flower's TCP port.")
    ] = 5555,
    web: Annotated[
        bool,
        typer.Option(
            "--web/--no-web",
            help="Also serve the web view on 127.0.0.1, behind "
            "the same credentials (default: no-web).",
            show_default=False,
        ),
    ] = False,
    web_port: Annotated[
        int, typer.Option(metavar="PORT", min=1, max=65535, help="The web view's TCP port.")
    ] = DEFAULT_WEB_PORT,
) -> None:
    """Run the service in the foreground: Redis (embedded default, with a password),
    workers (one for retrievals), beat; with --flower and --web, Flower and the web
    view on loopback, behind generated credentials (it prints where they are).

    Creates what is missing in the secrets directory: the keys of the producers
    `operator` (this machine's CLI) and `worker`, the Redis password, the credentials
    of Flower and the web view. Ctrl-C stops everything, in order.

    \b
    Examples:
      runwarden serve
      runwarden serve --flower --web --concurrency 4
    """
    options = ServiceOptions(concurrency, flower, flower_port, web, web_port)
    service = Service(Settings(), options)
    try:
        for line in service.prepare():
            out.print(line, markup=False, soft_wrap=True)
    except NotServing as error:
        fail(str(error), 1)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        raise typer.Exit(service.run(stopping, lambda line: out.print(line, markup=False)))
    finally:
        signal.signal(signal.SIGINT, previous)


@app.command()
def demo() -> None:
    """Start the service (embedded, in a new temporary state directory), launch the
    toy trainer, stop it with a snapshot, bring its checkpoint home, resume it and
    stop it again; then stop the service.

    \b
    Example:
      runwarden demo
    """
    raise typer.Exit(run_demo(out))
