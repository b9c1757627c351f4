"""Stops: asking a run's job for a snapshot, sending its proof and end deadlines, and
the proof seen; what the deadlines do, and cancels, are `workers.cancels`.

A stop is opened in the store (its proof deadline in the deadline table in the same
step) before anything is sent; the countdown task is the fast path and
`workers.reconcile` the guarantee (docs/architecture.md, "Durability").
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from schemas import (
    DeadlineKind,
    NotRunning,
    ProofSaved,
    RunRecord,
    SnapshotReason,
    StopPhase,
    StopState,
)
from schemas.events import TASK_END_TIMEOUT, TASK_PROOF_TIMEOUT
from schemas.ledger import ProofSeen, ProofSeenBy, StopOpened
from schemas.protocol import SNAPSHOT_REQUEST
from schemas.run import check_snapshot_request
from schemas.snapshot import proof_moment

from .budgets import FOUND_BY, countdown_limit_s, next_budget, record_stop_save
from .context import Context
from .executors import ExecError, ProtocolError, SshError
from .notify import emit

log = logging.getLogger("runwarden")

__all__ = [
    "notice_request",
    "proof_seen",
    "request_snapshot",
    "schedule_deadline",
    "send_deadline",
]


def schedule_deadline(
    ctx: Context, stop: StopState, kind: DeadlineKind, countdown_s: float
) -> None:
    """Sends the countdown task of `stop`'s `kind` deadline. A failure to send is
    logged only: the deadline is in the store's table and `reconcile` fires it."""
    send_deadline(ctx, stop.run_id, stop.stop_id, kind, countdown_s, reason=stop.reason)


def send_deadline(
    ctx: Context,
    run_id: str,
    stop_id: str,
    kind: DeadlineKind,
    countdown_s: float,
    *,
    reason: SnapshotReason | None = None,
) -> None:
    """Sends the `kind` deadline task of stop `stop_id` of `run_id` after `countdown_s`
    seconds; none when the countdown is longer than the broker keeps a message
    (`countdown_limit_s`). A failure to send is logged only: `reconcile` fires it."""
    if countdown_s > countdown_limit_s(ctx.settings):
        log.info("run %s: no countdown for its %s deadline: reconcile fires it", run_id, kind)
        return
    name = TASK_PROOF_TIMEOUT if kind == "proof" else TASK_END_TIMEOUT
    body: dict[str, str] = {"run_id": run_id, "stop_id": stop_id}
    if reason is not None:
        body["reason"] = str(reason)
    try:
        ctx.schedule(name, {"body": body}, countdown_s)
    except Exception:  # noqa: BLE001 - reconcile fires it from the deadline table
        log.warning("run %s: cannot send the %s deadline task", run_id, kind)


def _armed(ctx: Context, stop: StopState, how: str) -> StopState:
    """A newly opened `stop`: its proof countdown sent, and said in the log."""
    proof_s = (stop.proof_deadline - stop.asked_at).total_seconds()
    schedule_deadline(ctx, stop, "proof", proof_s)
    emit(ctx, StopOpened.of, stop)
    budget = "" if stop.budget is None else f", {stop.budget.describe()}: {stop.budget.why}"
    log.info("run %s: %s (%s, by %s%s)", stop.run_id, how, stop.reason, stop.asked_by, budget)
    return stop


def request_snapshot(
    ctx: Context,
    run_id: str,
    reason: SnapshotReason,
    asked_by: str,
    now: datetime,
    *,
    only_if_none_open: bool = False,
    found_by: str = FOUND_BY,
) -> StopState:
    """Asks the run's job for a snapshot: opens the stop (its proof deadline in the
    deadline table first), then writes the request; schedules the proof countdown for
    a new stop. Asking again changes only the reason, never the timers; with
    `only_if_none_open` (a policy) it changes nothing at all: the first reason stays
    and the open stop is returned as it is. A request found already written in the
    run directory then opens the stop as asked by `found_by` (whoever is known to
    write there: the notice watcher for a notice's stop).

    Raises:
        NotFound, NotStarted, NotRunning, NoSnapshots, ExecError, StoreError.
    """
    run = ctx.store.runs.get(run_id)
    check_snapshot_request(run)
    executor = ctx.executor(run.target)
    if only_if_none_open:
        # A request already in the run directory (the watchdog's, a person's) that no
        # tick has seen yet is the first one: noticed as the tick would, its reason
        # kept, nothing written over it. (A request written between this read and the
        # write below is replaced: a window of one round trip.)
        try:
            written = executor.read_from(f"{run.remote_dir}/{SNAPSHOT_REQUEST}", 0, 256)
        except ProtocolError:
            written = b""  # not a regular file: no request; the write below replaces it
        if written.strip():
            notice_request(
                ctx, run, written.decode("utf-8", "replace"), now, asked_by=found_by
            )
            found = ctx.store.stops.get(run_id)
            if found is not None:
                return found
    budget = next_budget(ctx, run)
    stop, opened = ctx.store.stops.open(
        run_id,
        reason,
        asked_by,
        now,
        budget.proof_timeout_s,
        replace_reason=not only_if_none_open,
        budget=budget,
    )
    if not opened and only_if_none_open:
        return stop
    try:
        executor.put_file(f"{run.remote_dir}/{SNAPSHOT_REQUEST}", str(stop.reason))
    except SshError:
        if opened:
            # Never asked, the target out of reach: a proof deadline would cancel a
            # job that was not told. Asking again opens a new stop.
            ctx.store.stops.close(run_id, stop.stop_id, note="the request could not be written")
        raise
    except ExecError as error:
        # The target answered but the request could not be put in place: the job's
        # own doing (its run directory holds something that cannot be replaced). The
        # stop stays: a job that cannot be asked is cancelled at its proof deadline.
        log.warning("run %s: the request could not be written: %s", run_id, error)
        if opened:
            stop = ctx.store.stops.advance(
                run_id,
                stop.stop_id,
                StopPhase.WAITING_PROOF,
                StopPhase.WAITING_PROOF,
                note=f"the request could not be written ({error}): cancelled at the deadline",
            ) or stop
    return _armed(ctx, stop, "snapshot asked") if opened else stop


def notice_request(
    ctx: Context, run: RunRecord, reason: str, now: datetime, *, asked_by: str = FOUND_BY
) -> None:
    """A request someone else wrote in the run directory: opens a stop for it, as if
    asked here by `asked_by` (the first reason stays)."""
    if not run.snapshots:
        return
    try:
        budget = next_budget(ctx, run)
        stop, opened = ctx.store.stops.open(
            run.id,
            SnapshotReason.parse(reason),
            asked_by,
            now,
            budget.proof_timeout_s,
            budget=budget,
        )
    except NotRunning:
        return  # it ended since this tick read it
    if opened:
        _armed(ctx, stop, "found a snapshot request")


def proof_seen(
    ctx: Context, stop: StopState, proof: ProofSaved, seen_at: datetime, by: ProofSeenBy
) -> StopState | None:
    """The valid proof of the running job of `stop` (as read, waiting for its proof),
    first seen at `seen_at` by `by` (a follow tick, or the proof deadline's task):
    moves the stop to `waiting_end` as one compare-and-set, its end deadline the
    stop's end timeout after the proof was written (the proof's own `time`, never
    before the request nor after `seen_at`: `schemas.snapshot.proof_moment`), then
    sends the end countdown, tells the ledger and, when a follow tick saw it, records
    the stop's save time (`workers.budgets.record_stop_save`). Returns the moved stop;
    None, with nothing done, when another task moved it first (a tick and a deadline
    racing move it once)."""
    end_s = ctx.settings.end_timeout_s if stop.budget is None else stop.budget.end_timeout_s
    proved_at = proof_moment(proof.time, stop.asked_at, seen_at)
    end = proved_at + timedelta(seconds=end_s)
    after = round((proved_at - stop.asked_at).total_seconds(), 1)
    moved = ctx.store.stops.advance(
        stop.run_id,
        stop.stop_id,
        StopPhase.WAITING_PROOF,
        StopPhase.WAITING_END,
        end_deadline=end,
        note=f"proof at step {proof.snapshot.step}, {after:g} s after it was asked "
        f"(seen by the {by}): waiting for the job to end",
    )
    if moved is None:
        return None
    schedule_deadline(ctx, moved, "end", max(0.0, (end - seen_at).total_seconds()))
    emit(ctx, ProofSeen.seen, stop, proof.snapshot, proved_at, seen_at=seen_at, by=by,
         end_deadline=end)  # fmt: skip
    if by == "follow":
        record_stop_save(ctx, stop, True, seen_at)
    log.info("run %s: proof at step %d seen by the %s: end deadline in %g s",
             stop.run_id, proof.snapshot.step, by,
             round((end - seen_at).total_seconds(), 1))  # fmt: skip
    return moved
