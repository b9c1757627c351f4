"""The commands that show: `runs`, `show`, `logs`, `stops`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from schemas.text import clean_text

from ..boundary import boundary_lines
from .common import (
    RunIdArgument,
    app,
    artifacts_line,
    chain_line,
    checked_run_id,
    client,
    continuation_line,
    fail,
    json_option,
    out,
    phase_line,
    print_json,
    progress_bar,
    run_op,
)

if TYPE_CHECKING:
    from schemas import RunRecord, StopState

    from ..api import Runwarden

__all__ = ["LOG_TAIL_LINES", "logs", "runs", "show", "stops"]

LOG_TAIL_LINES = 1000
"""Lines `logs` prints without --head or --tail: the newest held."""


def _chains(records: list[RunRecord]) -> list[list[RunRecord]]:
    """`records` (newest first) grouped by chain (runs linked by `resumed_from`): each
    chain oldest first, the chains ordered by their newest run. A run whose source is
    not among `records` starts a chain."""
    by_id = {r.id: r for r in records}

    def root(run: RunRecord) -> str:
        seen = {run.id}
        while run.resumed_from in by_id and run.resumed_from not in seen:
            run = by_id[run.resumed_from]
            seen.add(run.id)
        return run.id

    groups: dict[str, list[RunRecord]] = {}
    for run in records:  # newest first: a chain's place is that of its newest run
        groups.setdefault(root(run), []).append(run)
    return [list(reversed(group)) for group in groups.values()]


@app.command()
def runs(
    as_json: Annotated[
        bool, json_option("the runs' records (with --chains: a list of groups)")
    ] = False,
    chains: Annotated[
        bool,
        typer.Option(
            "--chains",
            help="Group the runs that resume one another (a preempted run and the runs "
            "that continued it), oldest first in each group.",
        ),
    ] = False,
) -> None:
    """List runs, newest first, with their progress and artifacts.

    \b
    Examples:
      runwarden runs
      runwarden runs --chains
      runwarden runs --json
    """
    api = client()
    records = run_op(api.list_runs)
    groups = _chains(records) if chains else [[r] for r in records]
    if as_json:
        if chains:
            print_json([[r.model_dump(mode="json") for r in g] for g in groups])
        else:
            print_json([r.model_dump(mode="json") for r in records])
        return
    table = Table(Column("run", no_wrap=True), "target", Column("state", no_wrap=True),
                  "progress", "artifacts", "created")  # fmt: skip
    for group in groups:
        for place, r in enumerate(group):
            progress = run_op(lambda r=r: api.store.follow.last_metrics(r.id))  # type: ignore[misc]
            artifacts = "" if r.artifacts is None else str(r.artifacts.phase)
            if r.artifacts is not None and r.artifacts.phase == "pending" and r.artifacts.error:
                artifacts += f" ({r.artifacts.attempts} failed)"
            shown = r.id if place == 0 else f"-> {r.id}"  # continues the row above
            table.add_row(shown, r.target, str(r.state), progress_bar(progress), artifacts,
                          r.created.strftime("%F %T"))  # fmt: skip
        if chains and len(group) > 1:
            table.add_section()
    out.print(table)


@app.command()
def show(
    run_id: RunIdArgument, as_json: Annotated[bool, json_option("the run's record")] = False
) -> None:
    """Show one run: its record, artifacts, progress and the stop in flight.

    \b
    Examples:
      runwarden show 20260601-020000-kqzmx-gpt
      runwarden show 20260601-020000-kqzmx-gpt --json
    """
    api = client()
    run = run_op(lambda: api.get_run(checked_run_id(run_id)))
    ledger = run_op(lambda: api.ledger(run.id))
    if as_json:
        entries = [e.model_dump(mode="json") for e in ledger]
        print_json({**run.model_dump(mode="json"), "ledger": entries})
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
    for label, text in [*boundary_lines(api, run), *_preemption_lines(run)]:
        out.print(f"[bold]{label:12}[/] {escape(text)}", highlight=False, soft_wrap=True)
    progress = run_op(lambda: api.store.follow.last_metrics(run.id))
    if progress is not None:
        out.print(f"[bold]{'progress':12}[/] {progress_bar(progress)}")
    current = run_op(lambda: api.get_stop(run.id))
    if current is not None:
        out.print(f"[bold]{'stop':12}[/] {phase_line(current, datetime.now(UTC))}")
    timeouts = _timeouts_line(api, run, current)
    if timeouts is not None:
        out.print(f"[bold]{timeouts[0]:12}[/] {escape(timeouts[1])}", highlight=False)
    from schemas import StoreError

    try:
        warning = api.store.health.memory().warning()
    except StoreError:
        warning = None  # a Redis that does not answer INFO: the run is shown all the same
    if warning is not None:
        out.print(f"[bold]{'redis':12}[/] {escape(warning)}", highlight=False, soft_wrap=True)
    for label, text in _chain_lines(api, run):
        out.print(f"[bold]{label:12}[/] {escape(text)}", highlight=False, soft_wrap=True)
    if ledger:
        from .ledger import ledger_table

        out.print("[bold]ledger[/]")
        out.print(ledger_table(ledger, with_run=False))


def _preemption_lines(run: RunRecord) -> list[tuple[str, str]]:
    """What `show` says of the run's preemption watch and its notice, and of a run
    lost after a notice (`schemas.run.lost_after_notice`), with labels."""
    from schemas.run import lost_after_notice

    if run.preemption is None:
        return []
    lines = [("preemption", clean_text(run.preemption.said(ended=run.state.is_terminal)))]
    if run.preemption.notice is not None:
        lines.append(("notice", clean_text(run.preemption.notice.said())))
    lines += [(label, clean_text(text)) for label, text in lost_after_notice(run)]
    return lines


def _chain_lines(api: Runwarden, run: RunRecord) -> list[tuple[str, str]]:
    """What `show` says of the chain of preempted runs this run belongs to, and of its
    own continuation, with labels; nothing for a run alone."""
    chain = run_op(lambda: api.chain(run.id))
    lines = []
    if len(chain) > 1 or run.continuation is not None:
        lines.append(("chain", chain_line(chain, run.id)))
    if run.continuation is not None:
        lines.append(("continued", continuation_line(run.continuation)))
    return lines


def _timeouts_line(
    api: Runwarden, run: RunRecord, current: StopState | None
) -> tuple[str, str] | None:
    """What `show` says of a stop's timeouts, and its label: those the open stop got;
    without one, those a running run's next stop would get (decided as a worker
    would, by the rule the workers published, `Runwarden.next_stop_budget`), with
    where that rule came from unless the run's own timeouts decide; else nothing."""
    if current is not None:
        return None if current.budget is None else (
            "timeout", f"{current.budget.describe()}: {current.budget.why}"
        )  # fmt: skip
    if run.state != "running" or not run.snapshots:
        return None
    budget, where = run_op(lambda: api.next_stop_budget(run))
    line = f"{budget.describe()}: {budget.why}"
    return "next stop", line if budget.source == "explicit" else f"{line} ({where})"


@app.command()
def logs(
    run_id: RunIdArgument,
    follow_: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep following until the run ends.")
    ] = False,
    head: Annotated[
        int | None,
        typer.Option(
            "--head",
            metavar="N",
            min=1,
            max=100_000,
            help="The oldest N lines held instead of the newest (not with -f).",
        ),
    ] = None,
    tail: Annotated[
        int,
        typer.Option("--tail", metavar="N", min=1, max=100_000, help="The newest N lines held."),
    ] = LOG_TAIL_LINES,
) -> None:
    """Print the run's log lines, as followed by the workers: the newest 1,000 held
    (--tail N: the newest N; --head N: the oldest N). The store keeps each run's
    newest lines only, within its byte budget; the whole `job.log` comes home with
    the artifacts.

    \b
    Examples:
      runwarden logs 20260601-020000-kqzmx-gpt
      runwarden logs 20260601-020000-kqzmx-gpt --tail 50
      runwarden logs 20260601-020000-kqzmx-gpt --head 20
      runwarden logs 20260601-020000-kqzmx-gpt -f
    """
    if head is not None and follow_:
        fail("--head reads the oldest lines: it does not go with -f", 2)
    api = client()
    run_id = checked_run_id(run_id)
    run_op(lambda: api.get_run(run_id))
    if head is not None:
        entries = run_op(lambda: api.store.follow.read_log(run_id, count=head))
    else:
        entries = run_op(lambda: api.store.follow.read_log_newest(run_id, count=tail))
    after = "0-0"
    while True:
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
        entries = run_op(
            lambda after=after: api.store.follow.read_log(run_id, after_id=after, count=1000)  # type: ignore[misc]
        )


@app.command()
def stops(
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[RUN_ID]", help="With --history: this run's stops only.", show_default=False
        ),
    ] = None,
    history: Annotated[
        bool,
        typer.Option(
            "--history",
            help="The stop ledger instead: who asked what, when, and what came "
            "of it, newest first.",
        ),
    ] = False,
    limit: Annotated[
        int,
        typer.Option(
            metavar="N", min=1, max=100_000, help="With --history: at most N entries (default 500)."
        ),
    ] = 500,
    as_json: Annotated[bool, json_option("the stops' records (or the ledger's entries)")] = False,
) -> None:
    """List the stops in flight: phase, reason, deadlines, time left, the proof timeout
    each got and where it came from (explicit, learned, default); with --history, the
    stop ledger of every run (or of RUN_ID), newest first.

    \b
    Examples:
      runwarden stops
      runwarden stops --json
      runwarden stops --history 20260601-020000-kqzmx-gpt
    """
    if history:
        _history(run_id, limit, as_json)
        return
    if run_id is not None:
        fail("a run id goes with --history", 2)
    api = client()
    current = run_op(api.list_stops)
    if as_json:
        # The whole record, as `/api/stops` gives it: who asked, the stop's id, its
        # last note and cancels included.
        print_json([s.model_dump(mode="json") for s in current])
        return
    now = datetime.now(UTC)
    table = Table(Column("run", no_wrap=True), "phase", "reason", "asked by", "asked at",
                  "time left", "proof timeout")  # fmt: skip
    for s in current:
        budget = ""
        if s.budget is not None:
            budget = f"{round(s.budget.proof_timeout_s, 1):g} s {s.budget.source}"
        table.add_row(s.run_id, str(s.phase), str(s.reason), escape(s.asked_by),
                      s.asked_at.strftime("%T"), phase_line(s, now).split("; ", 1)[1],
                      budget)  # fmt: skip
    out.print(table)


def _history(run_id: str | None, limit: int, as_json: bool) -> None:
    api = client()
    checked = None if run_id is None else checked_run_id(run_id)
    events = run_op(lambda: api.ledger_history(checked, limit))
    if as_json:
        print_json([e.model_dump(mode="json") for e in events])
        return
    from .ledger import ledger_table

    out.print(ledger_table(events, with_run=checked is None))
