"""The policies of a target's running runs (docs/architecture.md, "Policies"): the
time rules from the record alone, the disk rule from one read-only probe of the
target; each verdict published as a `runwarden.snapshot_request` event, as any
producer would (a policy never acts on a run directly)."""

from __future__ import annotations

import logging
from datetime import datetime

from schemas import RunRecord, RunState, SnapshotReason
from schemas.events import TASK_SNAPSHOT_REQUEST
from schemas.ledger import PolicyDecision
from schemas.policy import PolicyVerdict, disk_verdict, time_verdict

from .budgets import policy_save_lead_s
from .context import Context
from .executors import ExecError
from .notify import emit

log = logging.getLogger("runwarden")

__all__ = ["policy_target"]


def policy_target(ctx: Context, target: str, now: datetime) -> dict[str, int]:
    """Evaluates the policies of every followed, running run of `target` that reads
    snapshot requests and has no open stop: the time policies from the record and
    the run's save samples (asked early enough for its saves, `workers.budgets`);
    the disk policy from one read-only probe of the target, at most once per
    `disk_probe_s`. Each verdict is published as a `runwarden.snapshot_request` event
    with `only_if_none_open` (an open stop is never asked again, its first reason
    stays), at most once per run and policy period. Returns how many runs it looked
    at and how many it asked."""
    settings = ctx.settings
    ids = ctx.store.follow.runs(target)
    # The stops first, then the records: a run's end closes its stop in the same
    # transaction, so one that ended between the two reads is read ended, never as
    # running without a stop (asked again, and a decision told, after its end).
    stops = ctx.store.stops.get_many(ids)
    runs = [
        r
        for r, stop in zip(ctx.records(ids), stops, strict=True)
        if r is not None
        and r.job is not None
        and r.state is RunState.RUNNING
        and r.snapshots
        and stop is None
    ]
    verdicts: dict[str, PolicyVerdict] = {}
    for run in runs:
        verdict = time_verdict(
            run,
            now,
            lead_s=settings.deadline_lead_s,
            cost_fraction=settings.cost_fraction,
            save_lead_s=policy_save_lead_s(ctx, run),
        )
        if verdict is not None:
            verdicts[run.id] = verdict
    watched = [r for r in runs if r.limits.disk and r.id not in verdicts]
    if watched and ctx.store.locks.once(f"probe:{target}", ttl_s=settings.disk_probe_s):
        verdicts.update(_disk_verdicts(ctx, target, watched))
    for run_id, verdict in verdicts.items():
        # One event per run per tick at most; the request task decides.
        if not ctx.store.locks.once(f"policy:{run_id}", ttl_s=settings.policy_s):
            continue
        log.warning("run %s: policy asks a snapshot (%s): %s", run_id, verdict.reason, verdict.why)
        emit(ctx, PolicyDecision.of, run_id, verdict.reason, verdict.why, now)
        body = {
            "run_id": run_id,
            "reason": str(verdict.reason),
            "asked_by": f"policy:{verdict.reason}",
            "only_if_none_open": True,
        }
        try:
            ctx.schedule(TASK_SNAPSHOT_REQUEST, {"body": body}, 0.0)
        except Exception:  # noqa: BLE001 - the next tick asks again
            ctx.store.locks.forget(f"policy:{run_id}")
            log.warning("run %s: cannot publish the policy's request", run_id)
    return {"runs": len(runs), "asked": len(verdicts)}


def _disk_verdicts(ctx: Context, target: str, runs: list[RunRecord]) -> dict[str, PolicyVerdict]:
    """The disk policy's verdicts for `runs` of `target`, from one probe; a run whose
    directory could not be probed gets none (logged)."""
    try:
        samples = ctx.executor(target).disk_usage([r.remote_dir for r in runs])
    except ExecError as error:
        log.warning("target %s: disk probe failed: %s", target, error)
        return {}
    found: dict[str, PolicyVerdict] = {}
    for run, sample in zip(runs, samples, strict=True):
        if isinstance(sample, Exception):
            log.warning("run %s: disk probe: %s", run.id, sample)
            continue
        why = disk_verdict(
            sample,
            used_limit=ctx.settings.disk_used_fraction,
            checkpoint_factor=ctx.settings.disk_checkpoint_factor,
        )
        if why is not None:
            found[run.id] = PolicyVerdict(SnapshotReason.DISK, why)
    return found
