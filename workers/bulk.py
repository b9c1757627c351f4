"""Bulk stops (`runwarden.stop_many`): every run of the named targets that a selection
picks (all, labels, a name glob), asked for a snapshot through the single stop's own
steps (`workers.stops.request_snapshots`: each stop opened with its proof deadline in
the deadline table, one batched write of the request files per target), and a
summary of what came of each run.

Who may: a producer may act only on the runs of targets that allow it
(`TargetConfig.producers`); the runs a selection picks on any other named target are
each reported refused, with why, and the others are asked: the request as a whole is
refused only when it does not fit (its body, an unknown target).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from schemas import NoSnapshots, NotRunning, NotStarted, RunRecord, StopState
from schemas.events import StopManyBody, StopManyRefusal, StopManySummary
from schemas.labels import selects

from .context import Context
from .stops import request_snapshots

log = logging.getLogger("runwarden")

__all__ = ["select_runs", "stop_many"]


def select_runs(ctx: Context, body: StopManyBody) -> dict[str, list[RunRecord]]:
    """The runs of each target of `body` that its selection picks, newest first (every
    state: the summary says which are not running).

    Raises:
        UnknownTarget, Unauthenticated: a target that does not exist, or whose record
            is not the operator's (before anything is asked); StoreError.
    """
    picked: dict[str, list[RunRecord]] = {}
    for target in body.targets:
        ctx.target(target)  # an unknown target refuses the whole request, first
        picked[target] = [
            run
            for run in ctx.store.runs.find(target=target)
            if body.all or selects(run.labels, run.name, body.labels, body.name_glob)
        ]
    return picked


def stop_many(
    ctx: Context,
    body: StopManyBody,
    producer: str,
    asked_by: str,
    now: datetime,
    *,
    opened: Callable[[StopState], object] = lambda _: None,
) -> StopManySummary:
    """Asks a snapshot of every running run `body` selects on targets that allow
    `producer` (the message's verified signer), recorded as asked by `asked_by`;
    returns the summary (`schemas.events.StopManySummary`). `opened` is called with
    each stop of a Slurm job this request opened (the task cancels one still queued
    at once, as after a single stop: `workers.cancels.cancel_if_queued`).

    Raises:
        UnknownTarget, Unauthenticated, StoreError: before anything is asked.
    """
    picked = select_runs(ctx, body)
    refused: list[StopManyRefusal] = []
    not_running: list[str] = []
    candidates: list[RunRecord] = []
    for target, runs in picked.items():
        if not ctx.target(target).allows_producer(producer):
            why = f"producer {producer!r} may not act on target {target!r}"
            refused += [StopManyRefusal(run_id=run.id, why=why) for run in runs]
            continue
        for run in runs:
            if run.state.is_terminal:
                not_running.append(run.id)
            else:
                candidates.append(run)
    asked: list[str] = []
    already: list[str] = []
    for run, outcome, new in request_snapshots(ctx, candidates, body.reason, asked_by, now):
        if isinstance(outcome, StopState):
            (asked if new else already).append(run.id)
            if new and run.job is not None and run.job.slurm is not None:
                opened(outcome)
        elif isinstance(outcome, NotStarted | NotRunning):
            not_running.append(run.id)
        else:
            why = str(outcome) if isinstance(outcome, NoSnapshots) else f"not asked: {outcome}"
            refused.append(StopManyRefusal(run_id=run.id, why=why[:500]))
    log.info(
        "bulk stop by %s on %s: %d asked, %d already stopping, %d not running, %d refused",
        asked_by, ",".join(body.targets), len(asked), len(already), len(not_running),
        len(refused),
    )  # fmt: skip
    return StopManySummary(
        asked=tuple(asked),
        already_stopping=tuple(already),
        not_running=tuple(not_running),
        refused=tuple(refused),
    )
