"""Stops: asking a run's job for a snapshot, its proof and end deadlines, cancelling,
and `reconcile`, which fires every overdue deadline whose countdown did not run.

A stop is opened in the store (its proof deadline in the deadline table in the same
step) before anything is sent; the countdown task is the fast path and `reconcile`
the guarantee (docs/architecture.md, "Durability").
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Final

from schemas import (
    DeadlineKind,
    JobId,
    NotRunning,
    ProofNone,
    RunRecord,
    SnapshotReason,
    StopPhase,
    StopState,
    parse_proof,
)
from schemas.events import TASK_END_TIMEOUT, TASK_PROOF_TIMEOUT
from schemas.protocol import PROOF_LIMIT, SNAPSHOT_FILE, SNAPSHOT_REQUEST
from schemas.run import check_cancel, check_snapshot_request

from .artifacts import resend_due_retrievals
from .context import Context
from .executors import ExecError
from .finish import finish
from .launch import settle_launches

log = logging.getLogger("runwarden")

__all__ = [
    "CANCEL_RETRY_S",
    "cancel",
    "notice_request",
    "on_deadline",
    "reconcile",
    "request_snapshot",
    "schedule_deadline",
]

CANCEL_RETRY_S: Final = 60.0
"""When a cancel failed (the group survived, the target was unreachable), how long
until `reconcile` tries it again, in seconds."""
_EARLY_S: Final = 0.5
"""A deadline task arriving this much before its deadline still acts (clock skew
between beat, the broker and workers)."""


def schedule_deadline(
    ctx: Context, stop: StopState, kind: DeadlineKind, countdown_s: float
) -> None:
    """Sends the countdown task of `stop`'s `kind` deadline. A failure to send is
    logged only: the deadline is in the store's table and `reconcile` fires it."""
    name = TASK_PROOF_TIMEOUT if kind == "proof" else TASK_END_TIMEOUT
    body = {"run_id": stop.run_id, "stop_id": stop.stop_id}
    try:
        ctx.schedule(name, {"body": body}, countdown_s)
    except Exception:  # noqa: BLE001 - reconcile fires it from the deadline table
        log.warning("run %s: cannot schedule the %s countdown", stop.run_id, kind)


def _armed(ctx: Context, stop: StopState, how: str) -> StopState:
    """A newly opened `stop`: its proof countdown sent, and said in the log."""
    schedule_deadline(ctx, stop, "proof", ctx.settings.proof_timeout_s)
    log.info("run %s: %s (%s, by %s)", stop.run_id, how, stop.reason, stop.asked_by)
    return stop


def request_snapshot(
    ctx: Context,
    run_id: str,
    reason: SnapshotReason,
    asked_by: str,
    now: datetime,
    *,
    only_if_none_open: bool = False,
) -> StopState:
    """Asks the run's job for a snapshot: opens the stop (its proof deadline in the
    deadline table first), then writes the request; schedules the proof countdown for
    a new stop. Asking again changes only the reason, never the timers; with
    `only_if_none_open` (a policy) it changes nothing at all: the first reason stays
    and the open stop is returned as it is.

    Raises:
        NotFound, NotStarted, NotRunning, NoSnapshots, ExecError, StoreError.
    """
    run = ctx.store.get_run(run_id)
    check_snapshot_request(run)
    executor = ctx.executor(run.target)
    if only_if_none_open:
        # A request already in the run directory (the watchdog's, a person's) that no
        # tick has seen yet is the first one: noticed as the tick would, its reason
        # kept, nothing written over it. (A request written between this read and the
        # write below is replaced: a window of one round trip.)
        written = executor.read_from(f"{run.remote_dir}/{SNAPSHOT_REQUEST}", 0, 256)
        if written.strip():
            notice_request(ctx, run, written.decode("utf-8", "replace"), now)
            found = ctx.store.get_stop(run_id)
            if found is not None:
                return found
    stop, opened = ctx.store.open_stop(
        run_id,
        reason,
        asked_by,
        now,
        ctx.settings.proof_timeout_s,
        replace_reason=not only_if_none_open,
    )
    if not opened and only_if_none_open:
        return stop
    try:
        executor.put_file(f"{run.remote_dir}/{SNAPSHOT_REQUEST}", str(stop.reason))
    except ExecError:
        if opened:
            # Never asked: a proof deadline would cancel a job that was not told.
            ctx.store.close_stop(run_id, stop.stop_id, note="the request could not be written")
        raise
    return _armed(ctx, stop, "snapshot asked") if opened else stop


def notice_request(ctx: Context, run: RunRecord, reason: str, now: datetime) -> None:
    """A request someone else wrote in the run directory: opens a stop for it, as if
    asked here (the first reason stays)."""
    if not run.snapshots:
        return
    try:
        stop, opened = ctx.store.open_stop(
            run.id, SnapshotReason.parse(reason), "watch", now, ctx.settings.proof_timeout_s
        )
    except NotRunning:
        return  # it ended since this tick read it
    if opened:
        _armed(ctx, stop, "found a snapshot request")


def on_deadline(ctx: Context, run_id: str, stop_id: str, now: datetime) -> str:
    """Acts on the stop `stop_id` of `run_id` whose deadline may have come: the proof
    deadline cancels a job still running without a proof (one with a proof gets the
    end deadline); the end deadline cancels a job still running; a cancel that failed
    is retried. Returns what it did, for the task's result. A stale or early call
    changes nothing."""
    stop = ctx.store.get_stop(run_id)
    if stop is None or stop.stop_id != stop_id:
        return "stale"
    if stop.phase is StopPhase.CANCELLING:
        # Another task is cancelling the job, or died doing it: retry only once the
        # retry deadline has come, and only the task that re-arms it.
        retry = stop.end_deadline
        if retry is not None and now < retry - timedelta(seconds=_EARLY_S):
            return "cancelling"
        return _escalate(ctx, stop, "retrying the cancel", now)
    due = stop.proof_deadline if stop.phase is StopPhase.WAITING_PROOF else stop.end_deadline
    if due is not None and now < due - timedelta(seconds=_EARLY_S):
        return "early"
    run = ctx.store.get_run(run_id)
    if run.job is None or run.state.is_terminal:
        ctx.store.close_stop(run_id, stop_id, note="the run is not running")
        return "ended"
    executor = ctx.executor(run.target)
    status = executor.status(run.job)
    if status.is_finished:
        finish(ctx, run, status, executor)
        return "ended"
    if stop.phase is StopPhase.WAITING_PROOF:
        proof_path = f"{run.remote_dir}/{SNAPSHOT_FILE}"
        proof = parse_proof(executor.read_from(proof_path, 0, PROOF_LIMIT))
        if not isinstance(proof, ProofNone):
            end = now + timedelta(seconds=ctx.settings.end_timeout_s)
            moved = ctx.store.advance_stop(
                run_id,
                stop_id,
                StopPhase.WAITING_PROOF,
                StopPhase.WAITING_END,
                end_deadline=end,
                note="proof seen: waiting for the job to end",
            )
            if moved is not None:
                schedule_deadline(ctx, moved, "end", ctx.settings.end_timeout_s)
            return "proved"
        note = (
            f"no snapshot {ctx.settings.proof_timeout_s:g} s after it was asked for: "
            "cancelling the job"
        )
    else:
        note = "the job saved its snapshot but did not end: cancelling it"
    return _escalate(ctx, stop, note, now)


def _escalate(ctx: Context, stop: StopState, note: str, now: datetime) -> str:
    """Moves `stop` (as read) to `cancelling`, with a retry deadline in case this
    worker dies, and cancels the job; "stale" when another task moved it first."""
    moved = ctx.store.advance_stop(
        stop.run_id,
        stop.stop_id,
        stop.phase,
        StopPhase.CANCELLING,
        end_deadline=now + timedelta(seconds=CANCEL_RETRY_S),
        note=note,
    )
    if moved is None:
        return "stale"
    log.warning("run %s: %s", moved.run_id, note)
    run = ctx.store.get_run(moved.run_id)
    if run.job is None or run.state.is_terminal:
        ctx.store.close_stop(run.id, moved.stop_id, note="the run is not running")
        return "ended"
    try:
        record = _cancel_once(ctx, run, run.job)
    except ExecError as error:
        log.warning("run %s: cancel failed, retried in %g s: %s", run.id, CANCEL_RETRY_S, error)
        return "cancel failed"
    return "cancelled" if record.state.is_terminal else "cancelling"


def _cancel_once(ctx: Context, run: RunRecord, job: JobId) -> RunRecord:
    """Cancels the run's job unless another task is cancelling it right now (one marker
    per run in the store, for as long as a cancel may take), so the job is signalled
    once; the other task waits for the outcome and returns the run as recorded then.

    Raises:
        ExecError: the cancel failed (the marker is dropped: a retry may try).
    """
    key = f"cancel:{run.id}"
    if not ctx.store.once(key, ttl_s=CANCEL_RETRY_S):
        deadline = time.monotonic() + CANCEL_RETRY_S
        record = ctx.store.get_run(run.id)
        while not record.state.is_terminal and time.monotonic() < deadline:
            time.sleep(0.2)
            record = ctx.store.get_run(run.id)
        return record
    executor = ctx.executor(run.target)
    try:
        executor.cancel(job)
        status = executor.status(job)
    except ExecError:
        ctx.store.forget(key)
        raise
    return finish(ctx, run, status, executor)


def cancel(ctx: Context, run_id: str) -> RunRecord:
    """Cancels the run's job now and records the outcome.

    Raises:
        NotFound, NotStarted, NotRunning, ExecError, StoreError.
    """
    run = ctx.store.get_run(run_id)
    return _cancel_once(ctx, run, check_cancel(run))


def reconcile(ctx: Context, now: datetime, limit: int = 200) -> int:
    """Fires every overdue deadline whose countdown did not (a worker killed, a
    message lost), and sends the retrieval task of every retrieval that is due;
    returns how many deadlines it acted on. A deadline is taken under a lease, so two
    reconcilers never fire it at once; one that fails is logged and left to the next
    tick."""
    resend_due_retrievals(ctx, now, limit)
    done = 0
    for deadline in ctx.store.due_deadlines(now, limit):
        if not ctx.store.claim_deadline(deadline, ctx.worker_id, ctx.settings.deadline_lease_s):
            continue
        try:
            on_deadline(ctx, deadline.run_id, deadline.stop_id, now)
            done += 1
        except Exception:
            log.exception("run %s: deadline failed", deadline.run_id)
    settle_launches(ctx, now, limit)
    return done
