"""`runwarden serve` (the service in the foreground) and `runwarden demo`."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from schemas import Settings
from schemas.webhooks import WebhookConfigError, load_webhooks

from ..demo import run_demo
from ..embedded import NotServing
from ..metrics import MetricsServer, serve_metrics
from ..service import Service, ServiceOptions
from ..web import DEFAULT_PORT as DEFAULT_WEB_PORT
from .common import app, fail, out

__all__ = ["demo", "serve"]


def _metrics(settings: Settings, port: int | None) -> MetricsServer | None:
    """The metrics endpoint on 127.0.0.1:`port` when one is given (exit 1 when it
    cannot be bound)."""
    if port is None:
        return None
    try:
        return serve_metrics(settings, port=port)
    except OSError as error:
        fail(f"cannot serve metrics on 127.0.0.1:{port}: {error}", 1)


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
    of Flower and the web view. Ctrl-C stops everything, in order.

    \b
    Examples:
      runwarden serve
      runwarden serve --flower --web --concurrency 4
      runwarden serve --metrics-port 9464
    """
    settings = Settings()
    try:
        load_webhooks(settings.webhooks)
    except WebhookConfigError as error:
        fail(str(error), 2)
    options = ServiceOptions(concurrency, flower, flower_port, web, web_port)
    service = Service(settings, options)
    try:
        for line in service.prepare():
            out.print(line, markup=False, soft_wrap=True)
    except NotServing as error:
        fail(str(error), 1)
    metrics = _metrics(settings, metrics_port)
    if metrics is not None:
        out.print(f"metrics: http://127.0.0.1:{metrics.port}/metrics", markup=False)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        raise typer.Exit(service.run(stopping, lambda line: out.print(line, markup=False)))
    finally:
        signal.signal(signal.SIGINT, previous)
        if metrics is not None:
            metrics.close()


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
