"""Cancels: a producer's cancel of a run's job, and what a stop's proof and end
deadlines do when they come (`on_deadline`): a job without a valid proof, or that did
not end after it, is cancelled; a cancel that failed is told (the ledger event
`cancel_failed`, which a webhook may want: the job may still run) and retried with a
doubling wait (`workers.cancel_mark.CANCEL_RETRY_S`). Whatever the cancel finds is
recorded by `workers.finish`.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Final

from schemas import (
    JobId,
    JobStatus,
    NotRunning,
    ProofInvalid,
    ProofSaved,
    RunRecord,
    SnapshotReason,
    StopPhase,
    StopState,
)
from schemas.errors import NotReplicated
from schemas.ledger import CancelDecided, CancelFailed, JobCancelled
from schemas.run import check_cancel
from schemas.snapshot import Proof

from .cancel_mark import CANCEL_RETRY_MAX_S, CANCEL_RETRY_S, cancel_key, cancelling_now
from .context import Context, utcnow
from .executors import CANCEL_DEADLINE_S, CommandError, ExecError, Executor, ProtocolError
from .executors.slurm import SlurmExecutor
from .finish import finish, read_proof
from .notify import emit
from .stops import proof_seen

log = logging.getLogger("runwarden")

__all__ = ["cancel", "on_deadline"]

SETTLE_S: Final = 2.0
"""Seconds a job may still be told running once its cancel answered, before the
cancel counts as failed (`_status_after_cancel`)."""

_EARLY_S: Final = 0.5
"""A deadline task arriving this much before its deadline still acts (clock skew
between beat, the broker and workers)."""


def on_deadline(ctx: Context, run_id: str, stop_id: str, now: datetime) -> str:
    """Acts on the stop `stop_id` of `run_id` whose deadline may have come: the proof
    deadline cancels a job still running without a proof (one with a proof gets the
    end deadline); the end deadline cancels a job still running; a cancel that failed
    is retried. Returns what it did, for the task's result. A stale or early call
    changes nothing."""
    stop = ctx.store.stops.get(run_id)
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
    run = ctx.store.runs.get(run_id)
    if run.job is None or run.state.is_terminal:
        ctx.store.stops.close(run_id, stop_id, note="the run is not running")
        return "ended"
    executor = ctx.executor(run.target)
    status: JobStatus | None
    try:
        status = executor.status(run.job)
    except ProtocolError as error:
        # Garbage from the run directory: whatever it means, the deadline acts.
        log.warning("run %s: its status cannot be read: %s", run_id, error)
        status = None
    if status is not None and status.is_finished:
        if cancelling_now(ctx, run_id):
            return "cancelling"  # a producer's cancel records the end after its sweep
        finish(ctx, run, status, executor)
        return "ended"
    if stop.phase is StopPhase.WAITING_PROOF:
        return _proof_deadline(ctx, stop, run, read_proof(executor, run), now)
    note = "the job saved its snapshot but did not end: cancelling it"
    return _escalate(ctx, stop, note, now)


def cancel_if_queued(ctx: Context, stop: StopState, now: datetime) -> str | None:
    """Cancels at once, rather than at its proof deadline, the job of the newly opened
    `stop` (waiting for its proof) when its scheduler still holds it queued (a Slurm
    job `PENDING`): nothing of it ran, so nothing can be saved, and left queued it
    would start, run to its first step end and save for nothing. What the cancel did
    ([`_escalate`]), or None when the job is not a queued one (or its state cannot be
    read: the proof deadline acts then)."""
    if stop.phase is not StopPhase.WAITING_PROOF:
        return None
    run = ctx.store.runs.get(stop.run_id)
    if run.job is None or run.job.slurm is None or run.state.is_terminal:
        return None
    executor = ctx.executor(run.target)
    if not isinstance(executor, SlurmExecutor):
        return None
    try:
        state = executor.slurm_states([run.job]).get(run.job.slurm)
    except ExecError as error:
        log.warning("run %s: its Slurm state cannot be read: %s", run.id, error)
        return None
    if state is None or state.state != "PENDING":
        return None
    return _escalate(ctx, stop, f"the Slurm job never started ({state}): nothing to save", now)


def _proof_deadline(
    ctx: Context, stop: StopState, run: RunRecord, proof: Proof | None, now: datetime
) -> str:
    """The proof deadline of a running job: a valid proof gets the end deadline
    ([`proof_seen`], the same path as a follow tick's); anything else (no proof, an
    invalid one, one that cannot be read) cancels it."""
    if isinstance(proof, ProofSaved):
        proof_seen(ctx, stop, proof, now, "deadline")
        return "proved"
    what = "no snapshot"
    if isinstance(proof, ProofInvalid):
        what = f"no valid snapshot ({proof.why})"
    elif proof is None:
        what = "no readable snapshot"
    waited = round((stop.proof_deadline - stop.asked_at).total_seconds(), 1)
    note = f"{what} {waited:g} s after it was asked for: cancelling the job"
    return _escalate(ctx, stop, note, now)


def _retry_s(cancels: int) -> float:
    """Seconds until a stop's cancel number `cancels` (from 1) is tried again if it
    fails: `CANCEL_RETRY_S`, doubled with each try, at most `CANCEL_RETRY_MAX_S`."""
    return float(min(CANCEL_RETRY_S * 2 ** (cancels - 1), CANCEL_RETRY_MAX_S))


def _escalate(ctx: Context, stop: StopState, note: str, now: datetime) -> str:
    """Moves `stop` (as read) to `cancelling`, with a retry deadline in case this
    worker dies or the cancel fails (`CANCEL_RETRY_S`, doubled with each try of this
    stop, at most `CANCEL_RETRY_MAX_S`), and cancels the job; "stale" when another
    task moved it first."""
    cancels = stop.cancels + 1
    retry_s = _retry_s(cancels)
    try:
        moved = ctx.store.stops.advance(
            stop.run_id,
            stop.stop_id,
            stop.phase,
            StopPhase.CANCELLING,
            end_deadline=now + timedelta(seconds=retry_s),
            note=note,
            cancels=cancels,
        )
    except NotReplicated:
        # Written on the primary, confirmed by no replica (a failover under way): the
        # deadline has come all the same, so the job is cancelled now, not at the
        # retry deadline; the stop as the primary holds it says the move was made.
        moved = ctx.store.stops.get(stop.run_id)
        if moved is None or (moved.stop_id, moved.phase) != (stop.stop_id, StopPhase.CANCELLING):
            raise
    if moved is None:
        return "stale"
    emit(ctx, CancelDecided.of, stop, note, now)
    log.warning("run %s: %s", moved.run_id, note)
    run = ctx.store.runs.get(moved.run_id)
    if run.job is None or run.state.is_terminal:
        ctx.store.stops.close(run.id, moved.stop_id, note="the run is not running")
        return "ended"
    try:
        record = _cancel_once(ctx, run, run.job)
    except ExecError as error:
        log.warning(
            "run %s: cancel %d failed, retried in %g s: %s", run.id, cancels, retry_s, error
        )
        emit(ctx, CancelFailed.of, moved, str(error), retry_s, utcnow())
        return "cancel failed"
    return "cancelled" if record.state.is_terminal else "cancelling"


def _cancel_once(ctx: Context, run: RunRecord, job: JobId) -> RunRecord:
    """Cancels the run's job unless another task is cancelling it right now (one marker
    per run in the store, for as long as a cancel may take), so the job is signalled
    once; the other task waits for the outcome, at most `CANCEL_DEADLINE_S`, and
    returns the run as recorded then (still running when that cancel goes on). The
    cancel's script has its deadline (`executors.cancel_deadline_s`): a process is
    never held longer than that, plus the time to reach an SSH target.

    Raises:
        ExecError: the cancel failed or was cut at its deadline (the marker is
            dropped: a retry may try).
    """
    key = cancel_key(run.id)
    if not ctx.store.locks.once(key, ttl_s=CANCEL_RETRY_S):
        # The other task's cancel ends within its deadline: waiting for it never holds
        # this process longer than a cancel of its own would.
        deadline = time.monotonic() + CANCEL_DEADLINE_S
        record = ctx.store.runs.get(run.id)
        while not record.state.is_terminal and time.monotonic() < deadline:
            time.sleep(0.2)
            record = ctx.store.runs.get(run.id)
        return record
    executor = ctx.executor(run.target)
    try:
        executor.cancel(job)
        emit(ctx, JobCancelled.of, run.id, utcnow())
        status = _status_after_cancel(executor, job)
    except ExecError:
        ctx.store.locks.forget(key)
        raise
    return finish(ctx, run, status, executor)


def _status_after_cancel(executor: Executor, job: JobId) -> JobStatus:
    """The status of `job` once its cancel script answered, read again every 0.1 s
    for up to `SETTLE_S` while it says running: the script answers once the group
    is gone, and nothing of it should be left, but a group is told alive while a
    member is a zombie its parent has not reaped yet (`workers.reaper`).

    Raises:
        CommandError: the job still runs then: the cancel did not end it (retried
            as a failed cancel, never recorded as an end).
        ExecError: the status could not be read.
    """
    deadline = time.monotonic() + SETTLE_S
    status = executor.status(job)
    if not status.is_finished:
        log.warning("job %s: still told running once its cancel answered: read again", job.dir)
    while not status.is_finished and time.monotonic() < deadline:
        time.sleep(0.1)
        status = executor.status(job)
    if not status.is_finished:
        raise CommandError("cancel", f"the job still runs {SETTLE_S:g} s after its cancel")
    return status


def cancel(ctx: Context, run_id: str, asked_by: str | None = None) -> RunRecord:
    """Cancels the run's job now and records the outcome; `asked_by` (the producer
    that asked) goes into the ledger.

    Raises:
        NotFound, NotStarted, NotRunning, ExecError, StoreError.
    """
    run = ctx.store.runs.get(run_id)
    job = check_cancel(run)
    emit(ctx, CancelDecided.manual, run_id, utcnow(), asked_by)
    try:
        return _cancel_once(ctx, run, job)
    except ExecError as error:
        _leave_to_reconcile(ctx, run_id, asked_by, error)
        raise


def _leave_to_reconcile(ctx: Context, run_id: str, asked_by: str | None, error: ExecError) -> None:
    """A cancel asked for that failed (cut at its deadline, the target out of reach):
    the run's stop, opened for it when there is none, moves to `cancelling` with a
    retry deadline (`CANCEL_RETRY_S`, doubling with each try), so `reconcile` tries
    the cancel again as it does a stop's, and the failure is told (`cancel_failed`).
    Never raises (logged): the producer gets the cancel's own error."""
    now = utcnow()
    try:
        stop, _ = ctx.store.stops.open(
            run_id,
            SnapshotReason.REQUESTED,
            asked_by or "cancel",
            now,
            CANCEL_RETRY_S,
            budget=None,
        )
        if stop.phase is StopPhase.CANCELLING:
            return  # a cancel of the stop's own is under way, with its retry deadline
        cancels = stop.cancels + 1
        retry_s = _retry_s(cancels)
        moved = ctx.store.stops.advance(
            run_id,
            stop.stop_id,
            stop.phase,
            StopPhase.CANCELLING,
            end_deadline=now + timedelta(seconds=retry_s),
            note=f"the cancel failed ({error}): retried in {retry_s:g} s",
            cancels=cancels,
        )
        log.warning("run %s: cancel failed, retried in %g s: %s", run_id, retry_s, error)
        if moved is not None:
            emit(ctx, CancelFailed.of, moved, str(error), retry_s, now)
    except NotRunning:
        return  # it ended meanwhile: nothing to retry
    except Exception:
        log.exception("run %s: the failed cancel cannot be left to reconcile", run_id)
