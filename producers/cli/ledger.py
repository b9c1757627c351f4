"""The stop ledger for a terminal: one row per event (`runwarden stops --history`, and
the ledger part of `runwarden show`)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Column, Table

from schemas.ledger import CancelDecided, LedgerEvent, PolicyDecision, StopOpened
from schemas.text import clean_text

__all__ = ["ledger_table", "who"]


def who(event: LedgerEvent) -> str:
    """Who asked or decided: a stop's `asked_by`, `policy:<name>`, `runwarden` for
    a deadline, the producer of a cancel asked (`manual` when unknown); "" for what
    just happened."""
    if isinstance(event, StopOpened):
        return event.asked_by
    if isinstance(event, PolicyDecision):
        return f"policy:{event.policy}"
    if isinstance(event, CancelDecided):
        return event.asked_by or ("manual" if event.cause == "manual" else "runwarden")
    return ""


def ledger_table(events: Sequence[LedgerEvent], *, with_run: bool = True) -> Table:
    """`events` as a table, in the order given: time (UTC), run (with `with_run`),
    stop (its first 8 characters), event, who, what happened. Text a job or a
    target wrote is cleaned of terminal controls and never read as markup."""
    columns = [Column("at (UTC)", no_wrap=True)]
    if with_run:
        columns.append(Column("run", no_wrap=True))
    columns += [Column("stop", no_wrap=True), Column("event", no_wrap=True), Column("by"),
                Column("what")]  # fmt: skip
    table = Table(*columns)
    for event in events:
        row = [event.at.strftime("%F %T")]
        if with_run:
            row.append(event.run_id)
        row += [
            (event.stop_id or "")[:8],
            event.kind,
            escape(clean_text(who(event))),
            escape(clean_text(event.describe())),
        ]
        table.add_row(*row)
    return table
