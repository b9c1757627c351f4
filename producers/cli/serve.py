"""`runwarden serve` (the service in the foreground) and `runwarden demo`."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from ..defaults import DEFAULT_WEB_PORT
from .common import app, err, fail, out

__all__ = ["demo", "serve"]


@app.command()
def serve(
    concurrency: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=1,
            max=64,
            help="Processes of the main worker (stops, launches, cancels: every task but "
            "retrievals and the follow ticks, which have workers of their own) (1-64).",
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
    metrics_port: Annotated[
        int | None,
        typer.Option(
            metavar="PORT",
            min=1,
            max=65535,
            help="Also serve Prometheus metrics on 127.0.0.1:PORT (default: none).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the service in the foreground: Redis (embedded default, with a password),
    workers (the main one, one for retrievals, one for the follow ticks), beat; with
    --flower and --web, Flower and the web view on loopback, behind generated
    credentials (it prints where they are).

    Creates what is missing in the secrets directory: the keys of the producers
    `operator` (this machine's CLI) and `worker`, the Redis password, the credentials
    of Flower and the web view. Ctrl-C (or SIGTERM) stops everything, in order, Redis
    last.

    A supervisor: a part that ends by itself (Redis, a worker, beat, Flower, the web
    view, the metrics endpoint) is started again after 1 s, doubling to 30 s (back to
    1 s once it stayed up 60 s), with a line on stderr naming it and how it ended;
    `runwarden status` shows the restarts. A part that ends 5 times within 300 s
    stops the service (exit 1, said why). No part outlives
    serve, however serve ends (kill -9 included); one serve per state directory.

    \b
    Examples:
      runwarden serve
      runwarden serve --flower --web --concurrency 4
      runwarden serve --metrics-port 9464
    """
    from schemas import Settings
    from schemas.errors import MissingExtra
    from schemas.webhooks import WebhookConfigError, load_webhooks

    from ..embedded import NotServing
    from ..service import ServeError, Service, ServiceOptions

    settings = Settings()
    try:
        load_webhooks(settings.webhooks)
    except WebhookConfigError as error:
        fail(str(error), 2)
    options = ServiceOptions(concurrency, flower, flower_port, web, web_port, metrics_port)
    service = Service(settings, options)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    # Before anything starts: a SIGTERM meanwhile stops what did start, in order.
    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        try:
            for line in service.prepare():
                out.print(line, markup=False, soft_wrap=True)
        except (NotServing, ServeError, MissingExtra) as error:
            fail(str(error), 1)
        code = service.run(
            stopping,
            lambda line: out.print(line, markup=False, soft_wrap=True),
            lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True),
        )
        raise typer.Exit(code)
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
    from ..demo import run_demo

    raise typer.Exit(run_demo(out))
