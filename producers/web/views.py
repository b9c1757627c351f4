"""What the pages show, read through the producers' API only (`Runwarden` and the
named methods of its store: `Runs.find`, `Follow.last_metrics`, `Follow.read_log`,
`Stops.history`, `ledger_history`). Every read is bounded: a fixed number of runs, of log pages, of
characters per log line."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from schemas import Progress, RunRecord, StopState, validate_run_id
from schemas.ledger import LedgerEvent
from schemas.run import lost_after_notice
from schemas.text import clean_text

from ..api import Runwarden
from ..boundary import boundary_lines
from .text import cut

__all__ = [
    "LEDGER_SHOWN",
    "LOG_LINES",
    "RUNS_SHOWN",
    "LogLine",
    "RunRow",
    "RunView",
    "check_entry_id",
    "run_rows",
    "run_view",
    "tail_log",
]

LEDGER_SHOWN: Final = 100
"""Newest ledger events a run page shows (`runwarden stops --history RUN` shows more)."""
RUNS_SHOWN: Final = 200
"""Newest runs listed on the runs page (`/api/runs` lists them all)."""
LOG_LINES: Final = 200
"""Log lines a run page shows (`runwarden logs` prints them all)."""
_LOG_PAGE: Final = 1000
# The store keeps about 10 000 lines a run: 12 pages reach the end of any stream
# read from its start, unless it grows by thousands of lines during the read.
_LOG_PAGES: Final = 12
_ENTRY_ID: Final = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


@dataclass(frozen=True)
class RunRow:
    """One line of the runs page."""

    run: RunRecord
    progress: Progress | None


@dataclass(frozen=True)
class LogLine:
    """One log line, cleaned of control sequences and cut to `text.LINE_CHARS`."""

    id: str
    text: str


@dataclass(frozen=True)
class RunView:
    """Everything the run page shows."""

    run: RunRecord
    progress: Progress | None
    stop: StopState | None
    history: list[StopState]
    log: list[LogLine]
    log_last: str
    """The id of the newest log entry read (`0-0` for none): the page's script reads
    on from it."""
    ledger: list[LedgerEvent] = field(default_factory=list)
    """The run's newest [`LEDGER_SHOWN`] ledger events, newest first."""
    lost: list[tuple[str, str]] = field(default_factory=list)
    """What is said of a run lost after a preemption notice, labelled
    (`schemas.run.lost_after_notice`); empty for any other run."""
    boundary: list[tuple[str, str]] = field(default_factory=list)
    """What holds the run's job, labelled (`contained`, `job-user`:
    `producers.boundary`); empty for a run without a job."""


def check_entry_id(entry_id: str) -> str:
    """`entry_id` when it is a log stream entry id (`<ms>-<seq>`).

    Raises:
        ValueError: for anything else.
    """
    if _ENTRY_ID.fullmatch(entry_id) is None:
        raise ValueError(f"invalid log entry id {entry_id[:40]!r}: expected <ms>-<seq>")
    return entry_id


def run_rows(api: Runwarden) -> list[RunRow]:
    """The newest [`RUNS_SHOWN`] runs, newest first, each with its progress.

    Raises:
        StoreError: the store failed.
    """
    runs = api.store.runs.find(limit=RUNS_SHOWN)
    return [RunRow(run, api.store.follow.last_metrics(run.id)) for run in runs]


def tail_log(
    api: Runwarden, run_id: str, after: str = "0-0", keep: int = LOG_LINES
) -> tuple[list[LogLine], str]:
    """The last `keep` log lines of the run after entry `after` (oldest first) and
    the id of the newest entry read (`after` when there is none). Reads at most
    12 pages of 1000 entries.

    Raises:
        InvalidRunId, StoreError.
    """
    lines: deque[LogLine] = deque(maxlen=keep)
    last = after
    for _ in range(_LOG_PAGES):
        entries = api.store.follow.read_log(run_id, after_id=last, count=_LOG_PAGE)
        lines.extend(LogLine(entry.id, cut(clean_text(entry.line))) for entry in entries)
        if entries:
            last = entries[-1].id
        if len(entries) < _LOG_PAGE:
            break
    return list(lines), last


def run_view(api: Runwarden, run_id: str) -> RunView:
    """The run page of `run_id`.

    Raises:
        InvalidRunId, NotFound, StoreError.
    """
    run = api.get_run(validate_run_id(run_id))
    log, last = tail_log(api, run.id)
    return RunView(
        run=run,
        progress=api.store.follow.last_metrics(run.id),
        stop=api.get_stop(run.id),
        history=api.store.stops.history(run.id),
        log=log,
        log_last=last,
        ledger=api.store.ledger.history(run.id, LEDGER_SHOWN),
        lost=lost_after_notice(run),
        boundary=boundary_lines(api, run),
    )
