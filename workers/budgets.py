"""Stop budgets at work: the timeouts a run's next stop gets (`schemas.budget`, from
the run's own timeouts, its save samples and the settings), the sample a stop that
proved leaves, how early the policies must ask, and the longest countdown a deadline
task may be sent with."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Final

from schemas import RunRecord, RunwardenError, Settings, StopPhase, StopState
from schemas.budget import SaveSample, StopBudget, save_lead_s, stop_budget

from .context import Context

log = logging.getLogger("runwarden")

__all__ = [
    "ARM_GRACE_S",
    "FOUND_BY",
    "NOTICE_SLACK_S",
    "countdown_horizon_s",
    "countdown_limit_s",
    "next_budget",
    "policy_save_lead_s",
    "record_stop_save",
    "request_time",
]

FOUND_BY = "watch"
"""`asked_by` of a stop opened for a request someone else wrote in the run directory:
its request was written before the stop was opened, at a time no worker knows, so
such a stop is no sample (it would be shorter than the save took)."""


NOTICE_SLACK_S = 5.0
"""Seconds a follow tick may take, or be late, beyond its period: with it, how long
before a worker first saw a preemption notice its watcher may have seen it
([`request_time`])."""


def next_budget(ctx: Context, run: RunRecord) -> StopBudget:
    """The timeouts of `run`'s next stop: its own, else learned from its save samples
    and its resume sources' (`store.budgets`), else the configured ones.

    Raises:
        StoreError.
    """
    return stop_budget(run.timeouts, ctx.store.budgets.learned(run), ctx.settings.budget_rule)


def policy_save_lead_s(ctx: Context, run: RunRecord) -> float:
    """How long before `run`'s deadline or the end of its cost budget its snapshot must
    be asked at the latest (`schemas.budget.save_lead_s`), in seconds; 0 for a run
    with neither limit (nothing read).

    Raises:
        StoreError.
    """
    if run.limits.max_hours is None and run.limits.max_cost_usd is None:
        return 0.0
    return save_lead_s(ctx.store.budgets.learned(run), ctx.settings.proof_timeout_factor)


def record_stop_save(ctx: Context, stop: StopState | None, proved: bool, now: datetime) -> None:
    """Records how long `stop` took from its request to the proof, when a follow tick
    first saw its valid proof (`proved`), or the run it belongs to has just ended
    with one, at `now`, while the stop still waited for it: `now - asked_at`, both
    read on the workers' clock. That is at least the true time (the job wrote its
    proof, then a worker saw it), so a budget learned from it is never too short by a
    target's clock. Nothing is recorded for a stop whose proof was first seen at its
    proof deadline (it only says "less than the timeout"), nor for one opened for a
    request found in the run directory (`FOUND_BY`): it was written before a worker
    saw it, at a time no worker knows, so the time would be short. A stop opened by a
    preemption notice (`notice:<source>`) counts from when the watcher saw the notice
    and wrote its request ([`request_time`]). A failure to record is logged only: a
    sample is advice."""
    if stop is None or not proved or stop.phase is not StopPhase.WAITING_PROOF:
        return
    if stop.asked_by == FOUND_BY:
        return
    asked = request_time(ctx, stop)
    if asked is None:
        return
    seconds = (now - asked).total_seconds()
    if seconds < 0:
        return
    try:
        ctx.store.budgets.record_save(stop.run_id, SaveSample(kind="stop", seconds=seconds, at=now))
    except Exception:  # noqa: BLE001 - advice only: the run's end is recorded
        log.warning("run %s: cannot record how long its stop took", stop.run_id)
        return
    log.info("run %s: its stop took %.1f s from request to proof", stop.run_id, seconds)


def request_time(ctx: Context, stop: StopState) -> datetime | None:
    """When `stop`'s request was made, as its save time counts it: `asked_at` for a
    stop asked through the service. For one opened by a preemption notice
    (`notice:<source>`), when the watcher saw the notice (`RunNotice.seen_at`: it
    writes its request right after), by the target's clock, kept within what the
    workers' clock knows: never later than `asked_at` (a worker had seen the notice
    then, so a target clock ahead cannot shorten the sample), nor earlier than one
    follow period plus [`NOTICE_SLACK_S`] before it (the follow reads the notice
    within a period of its writing: a target clock behind, or a service that was
    down when the notice came, stretches the sample by at most that). None when that
    time is unknown (no notice of that source recorded, its clock unread, the run
    record unreadable): no sample. Never raises."""
    if not stop.asked_by.startswith("notice:"):
        return stop.asked_at
    try:
        run = ctx.store.runs.get(stop.run_id)
    except RunwardenError:
        return None
    notice = run.preemption.notice if run.preemption is not None else None
    if notice is None or notice.seen_at is None or f"notice:{notice.source}" != stop.asked_by:
        return None
    window = timedelta(seconds=ctx.settings.follow_poll_s + NOTICE_SLACK_S)
    return min(max(notice.seen_at, stop.asked_at - window), stop.asked_at)


ARM_GRACE_S: Final = 10.0
"""How long past its time a deadline's countdown stays marked sent
(`Stops.arm_deadline`), so that no sweep sends it again before it fires."""


def countdown_horizon_s(settings: Settings) -> float:
    """How far ahead a deadline's countdown task is sent, in seconds: the settings'
    horizon, at least three reconcile periods (so `reconcile` arms every deadline
    before it is due), at most [`countdown_limit_s`]."""
    wanted = max(settings.countdown_horizon_s, 3 * settings.reconcile_s)
    return min(wanted, countdown_limit_s(settings))


def countdown_limit_s(settings: Settings) -> float:
    """The longest countdown a deadline task is sent with, in seconds: a worker holds
    such a message unacknowledged until its time, and one held past the broker's
    visibility timeout would be delivered twice (`Settings.visibility_timeout_s`
    covers the configured timeouts plus a task's run time). A longer deadline (a
    run's own or learned timeout) gets no countdown: `reconcile` fires it from the
    deadline table, at most one reconcile period late."""
    return settings.visibility_timeout_s - settings.task_max_runtime_s - 60.0
