"""The commands that show: `runs`, `show`, `logs`, `stops`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from schemas.text import clean_text

from .common import (
    app,
    artifacts_line,
    checked_run_id,
    client,
    out,
    phase_line,
    print_json,
    progress_bar,
    run_op,
)

__all__ = ["logs", "runs", "show", "stops"]

@app.command()
def runs(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List runs, newest first."""
    api = client()
    records = run_op(api.list_runs)
    if as_json:
        print_json([r.model_dump(mode="json") for r in records])
        return
    table = Table(Column("run", no_wrap=True), "target", Column("state", no_wrap=True),
                  "progress", "artifacts", "created")  # fmt: skip
    for r in records:
        progress = run_op(lambda r=r: api.store.last_metrics(r.id))  # type: ignore[misc]
        artifacts = "" if r.artifacts is None else str(r.artifacts.phase)
        if r.artifacts is not None and r.artifacts.phase == "pending" and r.artifacts.error:
            artifacts += f" ({r.artifacts.attempts} failed)"
        table.add_row(r.id, r.target, str(r.state), progress_bar(progress), artifacts,
                      r.created.strftime("%F %T"))  # fmt: skip
    out.print(table)


@app.command()
def show(run_id: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show one run."""
    api = client()
    run = run_op(lambda: api.get_run(checked_run_id(run_id)))
    if as_json:
        print_json(run.model_dump(mode="json"))
        return
    for key, value in run.model_dump(mode="json").items():
        if key in ("artifacts", "preemption"):
            continue
        out.print(
            f"[bold]{key:12}[/] {escape(clean_text(str(value)))}", highlight=False, soft_wrap=True
        )
    if run.artifacts is not None:
        line = artifacts_line(run.artifacts)
        out.print(f"[bold]{'artifacts':12}[/] {escape(line)}", highlight=False, soft_wrap=True)
    if run.preemption is not None:
        watch = clean_text(run.preemption.said(ended=run.state.is_terminal))
        out.print(f"[bold]{'preemption':12}[/] {escape(watch)}", highlight=False, soft_wrap=True)
        if run.preemption.notice is not None:
            notice = clean_text(run.preemption.notice.said())
            out.print(f"[bold]{'notice':12}[/] {escape(notice)}", highlight=False, soft_wrap=True)
    progress = run_op(lambda: api.store.last_metrics(run.id))
    if progress is not None:
        out.print(f"[bold]{'progress':12}[/] {progress_bar(progress)}")
    current = run_op(lambda: api.get_stop(run.id))
    if current is not None:
        out.print(f"[bold]{'stop':12}[/] {phase_line(current, datetime.now(UTC))}")


@app.command()
def logs(
    run_id: str,
    follow_: Annotated[bool, typer.Option("-f", "--follow", help="Keep following.")] = False,
) -> None:
    """Print the run's log lines (as followed by the workers)."""
    api = client()
    run_id = checked_run_id(run_id)
    run_op(lambda: api.get_run(run_id))
    after = "0-0"
    while True:
        entries = run_op(
            lambda after=after: api.store.read_log(run_id, after_id=after, count=1000)  # type: ignore[misc]
        )
        for entry in entries:
            # A job may print terminal escapes: the person's terminal never runs them.
            out.print(clean_text(entry.line), highlight=False, markup=False, soft_wrap=True)
            after = entry.id
        if not follow_:
            return
        if not entries:
            if run_op(lambda: api.get_run(run_id)).state.is_terminal:
                return
            time.sleep(0.5)


@app.command()
def stops(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the stops in flight: phase, reason, deadlines, time left."""
    api = client()
    current = run_op(api.list_stops)
    fields = ("run_id", "phase", "reason", "asked_at", "proof_deadline", "end_deadline")
    if as_json:
        print_json([{f: s.model_dump(mode="json")[f] for f in fields} for s in current])
        return
    now = datetime.now(UTC)
    table = Table(Column("run", no_wrap=True), "phase", "reason", "asked by", "asked at",
                  "time left")  # fmt: skip
    for s in current:
        table.add_row(s.run_id, str(s.phase), str(s.reason), escape(s.asked_by),
                      s.asked_at.strftime("%T"), phase_line(s, now).split("; ", 1)[1])  # fmt: skip
    out.print(table)
