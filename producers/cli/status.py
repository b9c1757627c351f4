"""`runwarden status`: the service's health, for people and for health checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from schemas.defaults import LATE_AFTER_S
from schemas.text import clean_text

from ..defaults import HEALTH_TIMEOUT_S
from .common import app, fail, one_line, out, print_json

if TYPE_CHECKING:
    from schemas.health_report import HealthReport

__all__ = ["render", "status"]

_STATE_STYLE = {
    "up": "green",
    "ok": "green",
    "DOWN": "bold red",
    "LATE": "bold red",
    "RESTARTING": "yellow",
}


def render(report: HealthReport) -> list[Text]:
    """The lines `runwarden status` prints for `report`: a verdict, an aligned table
    (what, state, name, detail), then one line per problem and per warning."""
    from ..health import report_rows

    verdict = "OK" if report.ok else f"DOWN ({len(report.problems)} problem(s))"
    lines = [Text.assemble("runwarden: ", (verdict, "bold green" if report.ok else "bold red"))]
    rows = report_rows(report)
    header = ("WHAT", "STATE", "NAME", "DETAIL")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for what, state, name, detail in [header, *rows]:
        lines.append(
            Text.assemble(
                what.ljust(widths[0]) + "  ",
                (state.ljust(widths[1]), _STATE_STYLE.get(state, "")),
                "  " + name.ljust(widths[2]) + "  " + detail,
            )
        )
    lines += [Text.assemble(("problem: ", "bold red"), clean_text(p)) for p in report.problems]
    lines += [Text.assemble(("warning: ", "yellow"), clean_text(w)) for w in report.warnings]
    return lines


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    late_after: Annotated[
        float,
        typer.Option(
            "--late-after", min=0.0, help="Seconds a periodic task may be late before it is down."
        ),
    ] = LATE_AFTER_S,
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=0.1, max=60.0, help="Longest wait on Redis, seconds."),
    ] = HEALTH_TIMEOUT_S,
) -> None:
    """Show the service's health; exit 1 when something is down, 0 otherwise (a
    health check: `runwarden status >/dev/null`).

    Down: Redis unreachable; no live worker consuming `runwarden`,
    `runwarden.retrieve` or `runwarden.watch`; no live beat; a periodic task late by more than
    --late-after seconds. A worker or beat killed without a shutdown is seen down
    at most 3 s after its last heartbeat (one a second). Warnings (exit 0): Redis
    memory above 80 % of maxmemory, a process whose heartbeat stopped, two beats, a
    deadline long overdue, a child of `runwarden serve` being restarted. With
    `runwarden serve`, a row per process it supervises: its pid, how many times serve
    restarted it, how it last ended. Every wait on Redis is bounded by --timeout (two round
    trips), so a down or hanging Redis answers within seconds. Behind Sentinel
    (RUNWARDEN_REDIS_URL=sentinel://...), each sentinel is asked in turn, once, where
    the primary is (a connect and a reply, --timeout each): when none names one (a
    master name they do not monitor, none reachable), Redis is unreachable, exit 1,
    with what each sentinel said.

    --json prints one object (times in seconds, on Redis's clock; ages are seconds
    since):

      ok (bool), checked_at (unix s), late_after_s, problems (strings), warnings
      (strings),
      redis {reachable, address, error, used_memory, maxmemory, memory_fraction},
      workers [{name, hostname, pid, queues (strings), alive, heartbeat_age_s}],
      beats (as workers, queues empty),
      periodic [{task, period_s, last_run_age_s, late_s, late}],
      queues [{name, depth, by_priority {step: messages}}],
      unacked (int),
      deadlines {pending, overdue, next {run_id, stop_id, kind, due_in_s} or null},
      serve [{name, hostname, pid, up_s, restarts, children [{name, pid (null: a
      thread of serve, or waiting), state (up, restarting), restarts, last_end,
      last_end_age_s}]}] (empty when no serve runs)

    With Redis unreachable: ok false, redis.reachable false with its error, the
    lists (serve too) empty, unacked and deadlines null. Unknown values are null. Fields may be
    added, never renamed or removed.

    \b
    Examples:
      runwarden status
      runwarden status --json --timeout 2
    """
    from pydantic import ValidationError

    from schemas import Settings

    from ..health import read_health

    try:
        settings = Settings()
    except ValidationError as error:
        fail(f"settings: {one_line(error)}", 2)
    report = read_health(settings, late_after_s=late_after, timeout_s=timeout)
    if as_json:
        print_json(report.model_dump(mode="json"))
    else:
        for line in render(report):
            out.print(line, highlight=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)
