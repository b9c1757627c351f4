"""`reconcile`: the durability sweep, run by beat's `runwarden.reconcile`. Whatever a
lost message or a killed worker left undone, it does again (docs/architecture.md,
"Durability"): the deadlines whose countdown did not run, the retrievals that are due,
the launches whose worker died (`settle_launches`) and the continuations that wait;
and it reads every target record, so this machine knows the newest version of each
soon after the operator stored it (`note_target_versions`).

Each part reads a durable table of the store (deadlines, retrievals, `preparing`
runs, continuations) and sends a task, or settles one run under the lock its own
operation takes, so two reconcilers, or a reconcile and a late message, act once.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Final

from schemas import NotFound, RunState, UnknownTarget
from schemas.auth import Unauthenticated
from schemas.chain import CONTINUE_RETRY_S
from schemas.events import TASK_CONTINUE, TASK_RETRIEVE

from .budgets import ARM_GRACE_S, countdown_horizon_s
from .cgroups import remove_empty
from .context import Context
from .executors import ExecError
from .find_job import (
    DIED_MESSAGE,
    LAUNCH_LEASE_S,
    claimed,
    find_job,
    follow_found,
    launch_lock,
)
from .lease import leased
from .stops import send_deadline

log = logging.getLogger("runwarden")

__all__ = [
    "RETRIEVE_RESEND_S",
    "continue_due",
    "note_target_versions",
    "reconcile",
    "resend_due_retrievals",
    "settle_launches",
]

RETRIEVE_RESEND_S: Final = 3600.0
"""When reconcile sent a due retrieval, how long until it sends it again if the task
has not started by then (it waits behind long ones on its queue; a duplicate is a
no-op, a lost message costs at most this long)."""


ARM_LIMIT: Final = 1000
"""Most deadlines one sweep sends countdowns for ahead of their time ([`arm_deadlines`])."""


def reconcile(ctx: Context, now: datetime, limit: int = 200) -> int:
    """The whole sweep, at `now`: sends the retrieval task of every retrieval that is
    due; sends the deadline task of every overdue deadline whose countdown did not run
    (a worker killed, a message lost), each under a lease so two reconcilers never send
    one twice; sends the countdowns of the deadlines that came within the countdown
    horizon ([`arm_deadlines`]); then settles the launches whose worker died (`settle_launches`) and
    sends the continuation task of every waiting continuation that is due
    (`continue_due`), and removes this machine's empty run cgroups that a run's end
    left (`cgroups.remove_empty`). Returns how many deadlines it sent. It acts on no running job
    itself: each deadline runs as a task of its own, so one run that takes long (a
    cancel waits up to 20 s for its job) never delays another's deadline.

    Raises:
        StoreError: the store cannot be read (the next reconcile tries again).
    """
    resend_due_retrievals(ctx, now, limit)
    sent = 0
    for deadline in ctx.store.stops.due_deadlines(now, limit):
        if not ctx.store.stops.claim_deadline(
            deadline, ctx.worker_id, ctx.settings.deadline_lease_s
        ):
            continue
        send_deadline(ctx, deadline.run_id, deadline.stop_id, deadline.kind, 0.0)
        sent += 1
    arm_deadlines(ctx, now)
    # After the deadlines, so they never wait on them: a settle may reach a target.
    settle_launches(ctx, now, limit)
    continue_due(ctx, now, limit)
    remove_empty()
    note_target_versions(ctx)
    return sent


def arm_deadlines(ctx: Context, now: datetime, limit: int = ARM_LIMIT) -> int:
    """Sends the countdown task of every pending deadline that came within the
    countdown horizon (`budgets.countdown_horizon_s`) since the last sweep: a stop's
    deadline further away got none when it was opened (a worker holds a countdown in
    memory until its time). Each is marked sent first (`Stops.arm_deadline`, until
    `ARM_GRACE_S` past its time), so the next sweeps never send it again; the mark is
    not the firing lease: should the countdown be lost, the first sweep after its
    time fires it as overdue, as any lost countdown.
    At most `limit` of the earliest a sweep; returns how many it sent.

    Raises:
        StoreError: the store cannot be read.
    """
    horizon = countdown_horizon_s(ctx.settings)
    armed = 0
    for deadline in ctx.store.stops.due_deadlines(now + timedelta(seconds=horizon), limit):
        ahead = (deadline.due - now).total_seconds()
        if ahead <= 0:
            continue  # overdue: the sweep's first part fires it
        if not ctx.store.stops.arm_deadline(deadline, ahead + ARM_GRACE_S):
            continue
        send_deadline(ctx, deadline.run_id, deadline.stop_id, deadline.kind, ahead)
        armed += 1
    return armed


def note_target_versions(ctx: Context) -> None:
    """Checks every target record, tombstones included, as a use does
    (`Context.target`: the operator's signature, a version no older than one seen),
    so this machine's highest version of each grows once the operator's change is
    stored, not at the target's next use: a record written back before that use is
    refused too. A record refused is logged (someone wrote into Redis).

    Raises:
        StoreError: the store cannot be read.
    """
    for name, record in ctx.store.targets.all_signed().items():
        try:
            ctx.target_versions.check(name, ctx.identities.check_target(name, record))
        except Unauthenticated as error:
            log.warning("target %s: refused: %s", name, error)


def resend_due_retrievals(ctx: Context, now: datetime, limit: int) -> None:
    """Sends the retrieval task of every retrieval that is due (a first one whose task
    was lost, or the next attempt after a failure); each is moved ahead first, so the
    next tick does not send it again while it waits in the queue."""
    for run_id in ctx.store.retrievals.due(now, limit):
        ctx.store.retrievals.schedule(run_id, now + timedelta(seconds=RETRIEVE_RESEND_S))
        ctx.send(TASK_RETRIEVE, run_id)


def continue_due(ctx: Context, now: datetime, limit: int = 100) -> int:
    """Sends the continuation task of every waiting continuation that is due
    (`workers.chain`), moving each ahead first so the next tick does not send it again
    while it waits in the queue; returns how many it sent."""
    due = ctx.store.continuations.due(now, limit)
    for run_id in due:
        ctx.store.continuations.schedule(run_id, now + timedelta(seconds=CONTINUE_RETRY_S))
        ctx.send(TASK_CONTINUE, run_id)
    return len(due)


def settle_launches(ctx: Context, now: datetime, limit: int = 100) -> int:
    """Settles every run still `preparing` longer than a launch may take
    (`launch_max_runtime_s` + `launch_grace_s`) whose launch is not at work (its
    key's lock is free; this call takes it, so a launch delivered meanwhile waits):
    a run whose job started (`job.pid` in its claimed run directory) is recorded
    running with it and followed; one whose job did not start is recorded failed
    ([`DIED_MESSAGE`]). A target that cannot be reached leaves its runs to the next
    call (and is not tried again in this one). Returns how many runs it settled.
    Never raises (it runs inside `reconcile`, whose deadlines must not wait on it):
    an error is logged, and what it left is tried by the next call.
    """
    settings = ctx.settings
    cutoff = now - timedelta(seconds=settings.launch_max_runtime_s + settings.launch_grace_s)
    settled = 0
    unreachable: set[str] = set()
    try:
        found = ctx.store.launches.preparing(cutoff, limit)
    except Exception:
        log.exception("cannot list the preparing runs; left for the next reconcile")
        return 0
    for run_id, key in found:
        try:
            settled += _settle(ctx, run_id, key, unreachable)
        except Exception:
            log.exception("run %s: cannot settle its launch; left for the next reconcile", run_id)
    return settled


def _settle(ctx: Context, run_id: str, key: str | None, unreachable: set[str]) -> bool:
    """Settles one run of `settle_launches`; whether it did. A target that cannot be
    reached is added to `unreachable`."""
    with leased(ctx.store.locks, launch_lock(key, run_id), LAUNCH_LEASE_S) as lease:
        if lease is None:
            return False  # its launch is at work
        try:
            run = ctx.store.runs.get(run_id)
        except NotFound:
            run = None
        if run is None or run.state is not RunState.PREPARING:
            ctx.store.launches.forget(run_id)
            return False
        if run.target in unreachable:
            return False
        try:
            executor = ctx.executor(run.target)
            job = None
            if claimed(executor, run, key):
                job = find_job(executor, run.remote_dir, run.job_mark)
            if job is not None:
                follow_found(ctx, executor, run, job, "its launch's worker died after the spawn")
                return True
        except UnknownTarget:
            ctx.store.runs.transition(
                run_id,
                RunState.FAILED,
                message=f"{DIED_MESSAGE} (its target {run.target!r} no longer exists)",
                expect={RunState.PREPARING},
            )
            return True
        except ExecError as error:
            unreachable.add(run.target)
            log.warning(
                "run %s: its launch's worker died; %s cannot be reached (%s): left for the "
                "next reconcile",
                run_id, run.target, error,
            )  # fmt: skip
            return False
        ctx.store.runs.transition(
            run_id, RunState.FAILED, message=DIED_MESSAGE, expect={RunState.PREPARING}
        )
        log.warning("run %s: %s", run_id, DIED_MESSAGE)
        return True
