"""Starts a runwarden worker or beat exactly as Celery's command line does
(`celery -A workers.app worker|beat`: the same `app.Worker` and `app.Beat` with the same
options), without loading that command line: its click groups and every installed
plugin of it (Flower's web stack, the REPL) cost 0.6 s of CPU at each start, about a
third of a worker's start (measured with the suite's redis-server, median of 3).
`runwarden serve` and the test harness start their processes this way; an operator
may use either form.

    python -m workers.start worker -n NAME@%h [-c N] [-Q QUEUE,...] [--loglevel L]
                                   [--without-gossip] [--without-mingle]
    python -m workers.start beat -s SCHEDULE_FILE [--loglevel L]

A worker exits with the worker's exit code; a usage error exits 2 before anything
starts. Events (`-E`) are on by the app's configuration.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers.start")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="a worker (consumes the queues, runs tasks)")
    worker.add_argument("-n", "--hostname", required=True, help="node name, %%h = host")
    worker.add_argument("-c", "--concurrency", type=int, default=2)
    worker.add_argument("-Q", "--queues", default=None, help="comma-separated; default all")
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument("--without-gossip", action="store_true")
    worker.add_argument("--without-mingle", action="store_true")
    beat = commands.add_parser("beat", help="beat (sends the periodic ticks)")
    beat.add_argument("-s", "--schedule", required=True, help="beat's state file")
    beat.add_argument("--loglevel", default="INFO")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the process `argv` asks for until it is told to stop; returns its exit
    code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "worker" and args.concurrency < 1:
        parser.error("-c must be at least 1")
    # Imported only now: a usage error costs no import of the app.
    from celery.utils.nodenames import default_nodename, host_format  # noqa: PLC0415

    from .app import app  # noqa: PLC0415

    if args.command == "beat":
        app.Beat(schedule=args.schedule, loglevel=args.loglevel).run()
        return 0
    worker = app.Worker(
        hostname=host_format(default_nodename(args.hostname)),
        concurrency=args.concurrency,
        queues=args.queues.split(",") if args.queues else None,
        loglevel=args.loglevel,
        without_gossip=args.without_gossip,
        without_mingle=args.without_mingle,
    )
    worker.start()
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main())
