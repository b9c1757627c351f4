"""The watch: one follow tick over a target's followed runs, through one batched read
of the target (`Executor.follow`): records new log lines and metrics, opens a stop for
a request someone else wrote, sees the proof of a stop that waits for it (its
checkpoint judged in one more script for the whole target), and finishes runs whose
job ended."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from schemas import (
    JobStatus,
    NotFound,
    ProofInvalid,
    ProofSaved,
    RunRecord,
    StopPhase,
    StopState,
    StoreError,
    parse_proof,
)
from store import Offsets

from .context import Context, utcnow
from .executors import ExecError, Executor, FollowEntry, FollowUpdate
from .finish import finish, judge_proofs
from .notice_watch import observe_notices
from .stops import cancelling_now, notice_request, proof_seen

log = logging.getLogger("runwarden")

__all__ = ["records", "watch_target", "watched_targets"]


def watched_targets(ctx: Context) -> list[str]:
    """The targets with at least one followed run (the fan-out of a tick)."""
    return ctx.store.followed_targets()


def records(ctx: Context, run_ids: list[str]) -> list[RunRecord | None]:
    """The records of `run_ids` in one round trip; an unreadable one is logged and
    read as missing (it must not stop the others)."""
    try:
        return ctx.store.get_runs(run_ids)
    except StoreError:
        found: list[RunRecord | None] = []
        for run_id in run_ids:
            try:
                found.append(ctx.store.get_run(run_id))
            except (StoreError, NotFound):
                log.exception("run %s: unreadable; no longer followed", run_id)
                found.append(None)
        return found


def watch_target(ctx: Context, target: str, now: datetime) -> dict[str, int]:
    """One tick over every followed run of `target`: one batched read for their
    statuses, new log and metrics bytes and snapshot requests, and the proof of each
    run whose stop waits for it; records lines, opens stops for requests someone else
    wrote, moves a stop whose running job proved to `waiting_end` (its checkpoint
    judged first, one script for every new proof: `workers.stops.proof_seen`),
    finishes runs that ended. Runs that ended or have no job are no longer followed.
    Returns how many runs it looked at and how many ended.

    Raises:
        ExecError: the target could not be read (the tick is retried next time).
        StoreError: the store failed.
    """
    ids = ctx.store.followed(target)
    runs: list[RunRecord] = []
    for run_id, found in zip(ids, records(ctx, ids), strict=True):
        if found is None or found.job is None or found.state.is_terminal:
            ctx.store.unfollow(run_id)
            continue
        runs.append(found)
    if not runs:
        return {"runs": 0}
    executor = ctx.executor(target)
    offsets = ctx.store.get_offsets_many([run.id for run in runs])
    stops = ctx.store.get_stops([run.id for run in runs])
    entries = [
        FollowEntry(run.job, o.log, o.metrics, _waits_for_proof(stop))
        for run, o, stop in zip(runs, offsets, stops, strict=True)
        if run.job is not None
    ]
    # A log further behind than the store keeps of it is read from its last budget's
    # worth: a job writing faster than a tick reads is never followed ever later.
    updates = executor.follow(
        entries,
        timeout_s=ctx.settings.follow_timeout_s,
        log_chunk=int(ctx.settings.log_bytes_per_run),
    )
    seen = utcnow()  # the proofs read were there by now
    proofs = _new_proofs(executor, runs, stops, updates)
    ended = 0
    for run, offset, update, stop in zip(runs, offsets, updates, stops, strict=True):
        try:
            ended += _one(ctx, run, offset, update, executor, now=now)
            proof = proofs.get(run.id)
            if proof is not None and stop is not None:
                proof_seen(ctx, stop, proof, seen, "follow")
        except (StoreError, ExecError) as error:
            # Redis or the target failed for this run: the next tick tries again.
            log.warning("run %s: this tick failed: %s", run.id, error)
        except Exception as error:
            # Anything else comes from what the job wrote: that run's own, never the
            # others'. Its bytes are skipped, so the next tick does not fail again.
            log.exception("run %s: its files could not be recorded", run.id)
            _skip(ctx, run, offset, update, error)
    return {"runs": len(runs), "ended": ended}


def _waits_for_proof(stop: StopState | None) -> bool:
    return stop is not None and stop.phase is StopPhase.WAITING_PROOF


def _new_proofs(
    executor: Executor,
    runs: list[RunRecord],
    stops: list[StopState | None],
    updates: list[FollowUpdate],
) -> dict[str, ProofSaved]:
    """The valid proofs this tick read of running jobs whose stop waits for its proof,
    by run id, each checkpoint judged by the one rule (`workers.finish.judge_proofs`:
    one script for them all). A proof not yet valid is left for a later tick or the
    proof deadline; a failure to judge is logged, and leaves them all for next time.
    Never raises for what a job wrote."""
    read: list[tuple[RunRecord, ProofSaved]] = []
    for run, stop, update in zip(runs, stops, updates, strict=True):
        if not _waits_for_proof(stop) or update.proof is None:
            continue
        if not isinstance(update.status, JobStatus) or update.status.kind != "running":
            continue  # ended (its end reads and judges the proof itself), or unknown
        parsed = parse_proof(update.proof)
        if isinstance(parsed, ProofSaved):
            read.append((run, parsed))
    if not read:
        return {}
    found = {}
    for (run, _), judged in zip(read, judge_proofs(executor, read), strict=True):
        if isinstance(judged, ProofSaved):
            found[run.id] = judged
        elif isinstance(judged, ProofInvalid):
            log.info("run %s: its proof is not valid (yet): %s", run.id, judged.why)
    return found


def _one(
    ctx: Context,
    run: RunRecord,
    offset: Offsets,
    update: FollowUpdate,
    executor: Executor,
    *,
    now: datetime,
) -> int:
    """Records what one tick found for `run`; 1 when it ended, else 0."""
    lines, used_log = update.log_lines()
    metric_lines, used_metrics = update.metrics_lines()
    metrics, dropped = _records(metric_lines)
    if dropped:
        lines.append(f"runwarden: {dropped} metrics line(s) ignored: not a JSON object")
    if used_log or used_metrics:
        ctx.store.record_tail(
            run.id,
            lines=lines,
            records=metrics,
            from_offsets=offset,
            to_offsets=Offsets(offset.log + used_log, offset.metrics + used_metrics),
        )
    observe_notices(ctx, run, update, now)  # a cloud's notice opens its stop first
    if update.request is not None and ctx.store.get_stop(run.id) is None:
        notice_request(ctx, run, update.request, now)
    if isinstance(update.status, JobStatus) and update.status.is_finished:
        if update.status.kind == "exited" and cancelling_now(ctx, run.id):
            # Between the kill and the `cancelled` marker a dead job's `exit_code` may be
            # one it forged before the kill: the cancel records the end from its own
            # reading, after the marker (a cancel that dies lapses in CANCEL_RETRY_S).
            return 0
        finish(ctx, run, update.status, executor)
        return 1
    if not isinstance(update.status, JobStatus):
        log.warning("run %s: %s", run.id, update.status)
    return 0


def _skip(
    ctx: Context, run: RunRecord, offset: Offsets, update: FollowUpdate, error: Exception
) -> None:
    """Moves `run`'s offsets past what this tick read, with a note in its log stream
    saying why; never raises (logged)."""
    _, used_log = update.log_lines()
    _, used_metrics = update.metrics_lines()
    note = f"runwarden: {used_log + used_metrics} bytes skipped: {type(error).__name__}"
    try:
        ctx.store.record_tail(
            run.id,
            lines=[note],
            records=[],
            from_offsets=offset,
            to_offsets=Offsets(offset.log + used_log, offset.metrics + used_metrics),
        )
    except Exception:
        log.exception("run %s: cannot skip its unreadable bytes", run.id)


def _records(lines: list[str]) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects among metrics `lines` that can be stored again as JSON, and how
    many lines were not. Any failure of one line (bad JSON, nesting past the parser's
    stack, a number past Python's digit limit) drops that line alone."""
    found = []
    dropped = 0
    for line in lines:
        if not line:
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
            json.dumps(record, allow_nan=True)
        except Exception:  # noqa: BLE001 - the job's bytes: any failure drops the line
            dropped += 1
            continue
        found.append(record)
    return found, dropped
