"""`runwarden serve` (the service in the foreground) and `runwarden demo`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Annotated

import typer

from schemas import Settings
from schemas.events import QUEUE, QUEUE_RETRIEVE
from schemas.webhooks import WebhookConfigError, load_webhooks

from ..demo import run_demo
from ..embedded import EmbeddedRedis, NotServing
from ..metrics import MetricsServer, serve_metrics
from .common import app, fail, out

__all__ = ["demo", "serve"]


def _checked_extras(settings: Settings, metrics_port: int | None) -> MetricsServer | None:
    """Checks the webhooks' configuration (exit 2 when it does not fit) and starts the
    metrics endpoint when a port is given (exit 1 when it cannot be bound)."""
    try:
        load_webhooks(settings.webhooks)
    except WebhookConfigError as error:
        fail(str(error), 2)
    if metrics_port is None:
        return None
    try:
        return serve_metrics(settings, port=metrics_port)
    except OSError as error:
        fail(f"cannot serve metrics on 127.0.0.1:{metrics_port}: {error}", 1)


@app.command()
def serve(
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Worker processes.")] = 2,
    flower: Annotated[bool, typer.Option(help="Also run Flower.")] = False,
    flower_port: Annotated[int, typer.Option(min=1, max=65535)] = 5555,
    metrics_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Prometheus metrics on 127.0.0.1:PORT.")
    ] = None,
) -> None:
    """Run the service in the foreground: Redis (embedded default), worker and beat."""
    settings = Settings()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    metrics = _checked_extras(settings, metrics_port)
    embedded = EmbeddedRedis(settings) if settings.redis_url is None else None
    if embedded is not None:
        try:
            embedded.start()
        except NotServing as error:
            fail(str(error), 1)
        out.print(f"redis: embedded, {settings.embedded_socket}")
    env = dict(os.environ)
    procs: list[subprocess.Popen[bytes]] = []
    python = sys.executable
    commands = [
        [python, "-m", "workers.reaper", "--restart", "--",
         python, "-m", "celery", "-A", "workers.app", "worker", "-Q", QUEUE,
         "-c", str(concurrency), "-E", "-n", "runwarden@%h", "--loglevel", "INFO"],
        # Retrievals download for as long as they take, on a worker of their own.
        [python, "-m", "workers.reaper", "--restart", "--",
         python, "-m", "celery", "-A", "workers.app", "worker", "-Q", QUEUE_RETRIEVE,
         "-c", "1", "-E", "-n", "retrieve@%h", "--loglevel", "INFO"],
        [python, "-m", "celery", "-A", "workers.app", "beat", "--loglevel", "INFO",
         "-s", str(settings.state_dir / "beat-schedule")],
    ]  # fmt: skip
    if flower:
        commands.append(
            [python, "-m", "celery", "-A", "workers.app", "flower",
             f"--port={flower_port}", "--address=127.0.0.1"]
        )  # fmt: skip
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for command in commands:
            procs.append(subprocess.Popen(command, env=env, start_new_session=True))
        out.print(f"serving: worker (concurrency {concurrency}), retrieval worker, beat"
                  + (f", flower on http://127.0.0.1:{flower_port}" if flower else "")
                  + (f", metrics on http://127.0.0.1:{metrics_port}/metrics" if metrics else "")
                  + " — Ctrl-C stops everything")  # fmt: skip
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
        # Soft shutdown: the worker finishes what it runs (a cancel runs to its end).
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if embedded is not None:
            embedded.stop()
        if metrics is not None:
            metrics.close()
    failed = [p for p in procs if p.returncode not in (0, -signal.SIGTERM, None)]
    raise typer.Exit(1 if failed and not stopping else 0)


@app.command()
def demo() -> None:
    """Start the service (embedded), launch the toy trainer, stop it with a snapshot."""
    raise typer.Exit(run_demo(out))
