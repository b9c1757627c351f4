"""Stops: asking a run's job for a snapshot, sending its proof and end deadlines, and
the proof seen; what the deadlines do, and cancels, are `workers.cancels`.

A stop is opened in the store (its proof deadline in the deadline table in the same
step) before anything is sent; the countdown task is the fast path and
`workers.reconcile` the guarantee (docs/architecture.md, "Durability").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Final, NamedTuple

from schemas import (
    Deadline,
    DeadlineKind,
    NotRunning,
    ProofSaved,
    RunRecord,
    RunwardenError,
    SnapshotReason,
    StopPhase,
    StopState,
)
from schemas.errors import NotReplicated
from schemas.events import TASK_END_TIMEOUT, TASK_PROOF_TIMEOUT
from schemas.ledger import ProofSeen, ProofSeenBy, StopOpened
from schemas.protocol import SNAPSHOT_REQUEST
from schemas.run import check_snapshot_request
from schemas.snapshot import proof_moment

from .budgets import (
    ARM_GRACE_S,
    FOUND_BY,
    countdown_horizon_s,
    next_budget,
    record_stop_save,
)
from .context import Context
from .executors import CommandError, ExecError, ProtocolError, SshError
from .notify import emit

log = logging.getLogger("runwarden")

MAX_WRITE_THREADS: Final = 16
"""Targets whose request files a bulk stop writes at once (one thread each)."""

__all__ = [
    "Asked",
    "notice_request",
    "proof_seen",
    "request_snapshot",
    "request_snapshots",
    "schedule_deadline",
    "send_deadline",
]


class Asked(NamedTuple):
    """One run of a bulk request ([`request_snapshots`]): its stop and whether this
    request opened it, or the error that refused it."""

    run: RunRecord
    outcome: StopState | RunwardenError
    opened: bool


def schedule_deadline(
    ctx: Context, stop: StopState, kind: DeadlineKind, countdown_s: float
) -> None:
    """Sends the countdown task of `stop`'s `kind` deadline when it is within the
    countdown horizon, marked sent until `ARM_GRACE_S` past its time so that
    `reconcile` does not send it again ([`reconcile.arm_deadlines`]);
    a deadline further away is left to `reconcile`. A failure to send is logged only:
    the deadline is in the store's table and `reconcile` fires it."""
    if countdown_s > countdown_horizon_s(ctx.settings):
        log.debug("run %s: %s deadline beyond the countdown horizon", stop.run_id, kind)
        return
    due = stop.end_deadline if kind == "end" and stop.end_deadline else stop.proof_deadline
    deadline = Deadline(run_id=stop.run_id, stop_id=stop.stop_id, kind=kind, due=due)
    with contextlib.suppress(RunwardenError):  # unmarked: at worst sent twice, acted on once
        ctx.store.stops.arm_deadline(deadline, countdown_s + ARM_GRACE_S)
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
    seconds; none when the deadline is further than the countdown horizon
    (`countdown_horizon_s`: a held countdown costs the worker memory until its time,
    and one longer than the broker keeps a message would come twice): `reconcile`
    sends it once it comes within the horizon. A failure to send is logged only:
    `reconcile` fires it."""
    if countdown_s > countdown_horizon_s(ctx.settings):
        log.debug("run %s: %s deadline beyond the countdown horizon", run_id, kind)
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
            notice_request(ctx, run, written.decode("utf-8", "replace"), now, asked_by=found_by)
            found = ctx.store.stops.get(run_id)
            if found is not None:
                return found
    try:
        stop, opened = _open(ctx, run, reason, asked_by, now, replace_reason=not only_if_none_open)
    except NotReplicated:
        # Opened on the primary, not confirmed on a replica: a failover may keep the
        # stop or lose it. The job is asked either way, so a stop that survives never
        # cancels a job that was not told, and one that is lost is opened again by the
        # follow tick that finds the request; the caller is told it failed.
        with contextlib.suppress(ExecError):
            executor.put_file(f"{run.remote_dir}/{SNAPSHOT_REQUEST}", str(reason))
        raise
    if not opened and only_if_none_open:
        return stop
    try:
        executor.put_file(f"{run.remote_dir}/{SNAPSHOT_REQUEST}", str(stop.reason))
    except ExecError as error:
        return _written(ctx, stop, opened, error)
    return _written(ctx, stop, opened, None)


def request_snapshots(
    ctx: Context,
    runs: Sequence[RunRecord],
    reason: SnapshotReason,
    asked_by: str,
    now: datetime,
) -> list[Asked]:
    """Asks the jobs of `runs` for a snapshot, as [`request_snapshot`] asks one (a
    person's request: an open stop gets the reason asked now), with one batched write
    per target: each run's stop opened with its proof deadline in the deadline table
    first (the same step, `_open`), then every request file of a target written by one
    `put_files` script (`Executor.put_files`; the targets at once, one thread each),
    then each outcome taken as a single stop takes its write's (`_written`: an
    unreachable target closes the stops this call opened; a request that could not
    be put in place leaves its stop to cancel at its deadline) and each new stop's
    proof countdown sent. Returns, per run in order, its stop and whether this call
    opened it, or the error that refused it (NotStarted, NotRunning, NoSnapshots,
    SshError, StoreError...): one run's refusal never stops the others. A stop opened
    but confirmed by no replica (NotReplicated) is refused, its request written all
    the same, as [`request_snapshot`] does."""
    answers: list[StopState | RunwardenError] = []
    opened_flags: list[bool] = []
    # What each target's batch writes: (run index, the reason to write).
    by_target: dict[str, list[tuple[int, str]]] = {}
    for i, run in enumerate(runs):
        try:
            check_snapshot_request(run)
            stop, opened = _open(ctx, run, reason, asked_by, now, replace_reason=True)
        except NotReplicated as error:
            # As a single stop: the job is asked all the same (`request_snapshot`).
            answers.append(error)
            opened_flags.append(False)
            by_target.setdefault(run.target, []).append((i, str(reason)))
            continue
        except RunwardenError as error:
            answers.append(error)
            opened_flags.append(False)
            continue
        answers.append(stop)
        opened_flags.append(opened)
        by_target.setdefault(run.target, []).append((i, str(stop.reason)))

    def write(target: str) -> list[ExecError | None]:
        stops = by_target[target]
        files = [(f"{runs[i].remote_dir}/{SNAPSHOT_REQUEST}", text) for i, text in stops]
        try:
            whys = ctx.executor(target).put_files(files)
        except ExecError as error:  # the whole write: every run of the target shares it
            return [error] * len(stops)
        except RunwardenError as error:  # no executor (an unknown or unsigned target)
            return [CommandError("put_files", str(error))] * len(stops)
        return [None if why is None else CommandError("put_files", why) for why in whys]

    if by_target:
        workers = min(len(by_target), MAX_WRITE_THREADS)
        with ThreadPoolExecutor(workers, thread_name_prefix="put-requests") as pool:
            written = dict(zip(by_target, pool.map(write, by_target), strict=True))
    for target, stops in by_target.items():
        for (i, _), failure in zip(stops, written[target], strict=True):
            opened_stop = answers[i]
            if not isinstance(opened_stop, StopState):
                continue  # not confirmed by a replica: asked, and refused all the same
            try:
                answers[i] = _written(ctx, opened_stop, opened_flags[i], failure)
            except RunwardenError as error:
                answers[i] = error
                opened_flags[i] = False
    return [Asked(r, a, o) for r, a, o in zip(runs, answers, opened_flags, strict=True)]


def _open(
    ctx: Context,
    run: RunRecord,
    reason: SnapshotReason,
    asked_by: str,
    now: datetime,
    *,
    replace_reason: bool,
) -> tuple[StopState, bool]:
    """Opens the stop of `run` (its timeouts decided now, its proof deadline in the
    deadline table in the same step), or finds the open one (`Stops.open`); returns it
    and whether this call opened it. Nothing is written or sent yet."""
    budget = next_budget(ctx, run)
    return ctx.store.stops.open(
        run.id,
        reason,
        asked_by,
        now,
        budget.proof_timeout_s,
        replace_reason=replace_reason,
        budget=budget,
    )


def _written(ctx: Context, stop: StopState, opened: bool, error: ExecError | None) -> StopState:
    """`stop` (opened by this request when `opened`) once its request file was written,
    or not (`error`): its proof countdown sent and told for a new stop.

    Raises:
        SshError: the target out of reach: never asked, so a new stop is closed (a
            proof deadline would cancel a job that was not told; asking again opens
            a new one).
    """
    if isinstance(error, SshError):
        if opened:
            note = "the request could not be written"
            ctx.store.stops.close(stop.run_id, stop.stop_id, note=note)
        raise error
    if error is not None:
        # The target answered but the request could not be put in place: the job's
        # own doing (its run directory holds something that cannot be replaced). The
        # stop stays: a job that cannot be asked is cancelled at its proof deadline.
        log.warning("run %s: the request could not be written: %s", stop.run_id, error)
        if opened:
            stop = (
                ctx.store.stops.advance(
                    stop.run_id,
                    stop.stop_id,
                    StopPhase.WAITING_PROOF,
                    StopPhase.WAITING_PROOF,
                    note=f"the request could not be written ({error}): cancelled at the deadline",
                )
                or stop
            )
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
