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
    JobStatus,
    NotRunning,
    ProofInvalid,
    ProofSaved,
    RunRecord,
    SnapshotReason,
    StopPhase,
    StopState,
)
from schemas.events import TASK_END_TIMEOUT, TASK_PROOF_TIMEOUT
from schemas.ledger import CancelDecided, JobCancelled, ProofSeen, ProofSeenBy, StopOpened
from schemas.protocol import SNAPSHOT_REQUEST
from schemas.run import check_cancel, check_snapshot_request
from schemas.snapshot import Proof, proof_moment

from .artifacts import resend_due_retrievals
from .budgets import FOUND_BY, countdown_limit_s, next_budget, record_stop_save
from .context import Context, utcnow
from .executors import CANCEL_DEADLINE_S, ExecError, ProtocolError, SshError
from .finish import finish, read_proof
from .launch import settle_launches
from .notify import emit

log = logging.getLogger("runwarden")

__all__ = [
    "CANCEL_RETRY_MAX_S",
    "CANCEL_RETRY_S",
    "cancel",
    "cancel_key",
    "cancelling_now",
    "notice_request",
    "on_deadline",
    "proof_seen",
    "reconcile",
    "request_snapshot",
    "schedule_deadline",
]

CANCEL_RETRY_S: Final = 60.0
"""When a cancel failed (the group survived, the target was unreachable, its script
was cut at its deadline), how long until `reconcile` tries it again, in seconds;
doubled after each failed try, up to [`CANCEL_RETRY_MAX_S`]. Also how long a
worker that died while cancelling keeps another task from signalling the job
again."""
CANCEL_RETRY_MAX_S: Final = 3600.0
_EARLY_S: Final = 0.5
"""A deadline task arriving this much before its deadline still acts (clock skew
between beat, the broker and workers)."""


def schedule_deadline(
    ctx: Context, stop: StopState, kind: DeadlineKind, countdown_s: float
) -> None:
    """Sends the countdown task of `stop`'s `kind` deadline. A failure to send is
    logged only: the deadline is in the store's table and `reconcile` fires it."""
    _send_deadline(ctx, stop.run_id, stop.stop_id, kind, countdown_s, reason=stop.reason)


def _send_deadline(
    ctx: Context,
    run_id: str,
    stop_id: str,
    kind: DeadlineKind,
    countdown_s: float,
    *,
    reason: SnapshotReason | None = None,
) -> None:
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
    run = ctx.store.get_run(run_id)
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
            found = ctx.store.get_stop(run_id)
            if found is not None:
                return found
    budget = next_budget(ctx, run)
    stop, opened = ctx.store.open_stop(
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
            ctx.store.close_stop(run_id, stop.stop_id, note="the request could not be written")
        raise
    except ExecError as error:
        # The target answered but the request could not be put in place: the job's
        # own doing (its run directory holds something that cannot be replaced). The
        # stop stays: a job that cannot be asked is cancelled at its proof deadline.
        log.warning("run %s: the request could not be written: %s", run_id, error)
        if opened:
            stop = ctx.store.advance_stop(
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
        stop, opened = ctx.store.open_stop(
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
    status: JobStatus | None
    try:
        status = executor.status(run.job)
    except ProtocolError as error:
        # Garbage from the run directory: whatever it means, the deadline acts.
        log.warning("run %s: its status cannot be read: %s", run_id, error)
        status = None
    if status is not None and status.is_finished:
        finish(ctx, run, status, executor)
        return "ended"
    if stop.phase is StopPhase.WAITING_PROOF:
        return _proof_deadline(ctx, stop, run, read_proof(executor, run), now)
    note = "the job saved its snapshot but did not end: cancelling it"
    return _escalate(ctx, stop, note, now)


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
    moved = ctx.store.advance_stop(
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


def _escalate(ctx: Context, stop: StopState, note: str, now: datetime) -> str:
    """Moves `stop` (as read) to `cancelling`, with a retry deadline in case this
    worker dies or the cancel fails (`CANCEL_RETRY_S`, doubled with each try of this
    stop, at most `CANCEL_RETRY_MAX_S`), and cancels the job; "stale" when another
    task moved it first."""
    cancels = stop.cancels + 1
    retry_s = min(CANCEL_RETRY_S * 2 ** (cancels - 1), CANCEL_RETRY_MAX_S)
    moved = ctx.store.advance_stop(
        stop.run_id,
        stop.stop_id,
        stop.phase,
        StopPhase.CANCELLING,
        end_deadline=now + timedelta(seconds=retry_s),
        note=note,
        cancels=cancels,
    )
    if moved is None:
        return "stale"
    emit(ctx, CancelDecided.of, stop, note, now)
    log.warning("run %s: %s", moved.run_id, note)
    run = ctx.store.get_run(moved.run_id)
    if run.job is None or run.state.is_terminal:
        ctx.store.close_stop(run.id, moved.stop_id, note="the run is not running")
        return "ended"
    try:
        record = _cancel_once(ctx, run, run.job)
    except ExecError as error:
        log.warning(
            "run %s: cancel %d failed, retried in %g s: %s", run.id, cancels, retry_s, error
        )
        return "cancel failed"
    return "cancelled" if record.state.is_terminal else "cancelling"


def cancel_key(run_id: str) -> str:
    """The once-marker held while a cancel of the run is under way (`_cancel_once`),
    for `CANCEL_RETRY_S` from its start."""
    return f"cancel:{run_id}"


def cancelling_now(ctx: Context, run_id: str) -> bool:
    """Whether a cancel of the run is under way (or began less than `CANCEL_RETRY_S`
    ago): its task records the run's end itself."""
    return ctx.store.marked(cancel_key(run_id))


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
    if not ctx.store.once(key, ttl_s=CANCEL_RETRY_S):
        # The other task's cancel ends within its deadline: waiting for it never holds
        # this process longer than a cancel of its own would.
        deadline = time.monotonic() + CANCEL_DEADLINE_S
        record = ctx.store.get_run(run.id)
        while not record.state.is_terminal and time.monotonic() < deadline:
            time.sleep(0.2)
            record = ctx.store.get_run(run.id)
        return record
    executor = ctx.executor(run.target)
    try:
        executor.cancel(job)
        emit(ctx, JobCancelled.of, run.id, utcnow())
        status = executor.status(job)
    except ExecError:
        ctx.store.forget(key)
        raise
    return finish(ctx, run, status, executor)


def cancel(ctx: Context, run_id: str, asked_by: str | None = None) -> RunRecord:
    """Cancels the run's job now and records the outcome; `asked_by` (the producer
    that asked) goes into the ledger.

    Raises:
        NotFound, NotStarted, NotRunning, ExecError, StoreError.
    """
    run = ctx.store.get_run(run_id)
    job = check_cancel(run)
    emit(ctx, CancelDecided.manual, run_id, utcnow(), asked_by)
    try:
        return _cancel_once(ctx, run, job)
    except ExecError as error:
        _leave_to_reconcile(ctx, run_id, asked_by, error)
        raise


def _leave_to_reconcile(
    ctx: Context, run_id: str, asked_by: str | None, error: ExecError
) -> None:
    """A cancel asked for that failed (cut at its deadline, the target out of reach):
    the run's stop, opened for it when there is none, moves to `cancelling` with a
    retry deadline (`CANCEL_RETRY_S`, doubling with each try), so `reconcile` tries
    the cancel again as it does a stop's. Never raises (logged): the producer gets
    the cancel's own error."""
    now = utcnow()
    try:
        stop, _ = ctx.store.open_stop(
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
        retry_s = min(CANCEL_RETRY_S * 2 ** (cancels - 1), CANCEL_RETRY_MAX_S)
        ctx.store.advance_stop(
            run_id,
            stop.stop_id,
            stop.phase,
            StopPhase.CANCELLING,
            end_deadline=now + timedelta(seconds=retry_s),
            note=f"the cancel failed ({error}): retried in {retry_s:g} s",
            cancels=cancels,
        )
        log.warning("run %s: cancel failed, retried in %g s: %s", run_id, retry_s, error)
    except NotRunning:
        return  # it ended meanwhile: nothing to retry
    except Exception:
        log.exception("run %s: the failed cancel cannot be left to reconcile", run_id)


def reconcile(ctx: Context, now: datetime, limit: int = 200) -> int:
    """Sends the deadline task of every overdue deadline whose countdown did not run
    (a worker killed, a message lost), each under a lease so two reconcilers never
    send one twice, and the retrieval task of every retrieval that is due; returns how
    many deadlines it sent. It acts on no run itself: each deadline runs as a task of
    its own, so one run that takes long (a cancel waits up to 20 s for its job) never
    delays another's deadline. Last, it settles the launches whose worker died
    (`workers.launch.settle_launches`)."""
    resend_due_retrievals(ctx, now, limit)
    sent = 0
    for deadline in ctx.store.due_deadlines(now, limit):
        if not ctx.store.claim_deadline(deadline, ctx.worker_id, ctx.settings.deadline_lease_s):
            continue
        _send_deadline(ctx, deadline.run_id, deadline.stop_id, deadline.kind, 0.0)
        sent += 1
    # After the deadlines, so they never wait on it: it may reach a target.
    settle_launches(ctx, now, limit)
    return sent
