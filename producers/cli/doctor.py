"""`runwarden doctor TARGET`: what a target has of what runwarden needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.markup import escape
from rich.table import Column, Table

from schemas.text import clean_text

from ..defaults import DOCTOR_WAIT_S
from .common import app, client, json_option, out, print_json, run_op

if TYPE_CHECKING:
    from schemas.doctor import DoctorReport

__all__ = ["doctor", "render"]

_STYLE: Final = {"ok": "green", "warn": "yellow", "missing": "bold red"}


def render(report: DoctorReport) -> None:
    """Prints `report` for a person: one row a check (what breaks shown for those not
    ok), then one summary line."""
    who = f", jobs as {report.run_as}" if report.run_as else ""
    out.print(
        f"target {report.target} ({report.kind}, {report.workdir}{who}), "
        f"checked by worker {report.worker}",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip
    table = Table(Column("check", no_wrap=True), Column("status", no_wrap=True), "found",
                  "what breaks")  # fmt: skip
    for check in report.checks:
        style = _STYLE[check.status]
        breaks = "" if check.status == "ok" else check.breaks
        # What a target answered is shown, never interpreted by the terminal.
        table.add_row(check.name, f"[{style}]{check.status}[/]",
                      escape(clean_text(check.found)), escape(clean_text(breaks)))  # fmt: skip
    out.print(table)
    missing, warnings = len(report.missing), len(report.warnings)
    if missing:
        summary = f"[bold red]{missing} missing[/], {warnings} warning(s): runwarden cannot "
        summary += "work fully on this target"
    elif warnings:
        summary = f"[green]usable[/], with {warnings} warning(s)"
    else:
        summary = "[green]everything runwarden needs is there[/]"
    out.print(summary, highlight=False)


@app.command()
def doctor(
    target: Annotated[
        str,
        typer.Argument(
            metavar="TARGET",
            help="The target to check (`runwarden targets ls`).",
            show_default=False,
        ),
    ],
    as_json: Annotated[bool, json_option("the report")] = False,
    wait: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=1,
            help=f"How long to wait for a worker's answer, in s (default {DOCTOR_WAIT_S:g}).",
            show_default=False,
        ),
    ] = DOCTOR_WAIT_S,
) -> None:
    """Check that TARGET has what runwarden needs, as a worker sees it (its SSH keys,
    its user, its clock): each item's status (ok, warn, missing), what was found, and
    what does not work without it. Exit 1 when something needed is missing, 0 with
    warnings only.

    \b
    Examples:
      runwarden doctor here
      runwarden doctor gpu1 --json
    """
    api = client()
    report = run_op(lambda: api.doctor(target, wait_s=wait))
    if as_json:
        print_json(report.model_dump(mode="json"))
    else:
        render(report)
    raise typer.Exit(report.exit_code)
