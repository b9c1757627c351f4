"""The watch: one follow tick over a target's followed runs, through one batched read
of the target (`Executor.follow`): records new log lines and metrics, opens a stop for
a request someone else wrote, sees the proof of a stop that waits for it (its
checkpoint judged in one more script for the whole target), and finishes runs whose
job ended. The runs that ended come first, then every other run's lines, then what
the others asked: a tick that opens many stops delays no end and no progress.

Preemption notices in the follow: what a tick does with the notice watcher's files
(`notice.json`, `.runwarden/notice.state`, read by `Executor.follow`, bounded):

- the first notice seen opens the run's stop at once, reason `preempted`, asked by
  `notice:<source>` (the watcher's own request, or, when the tick sees the notice
  before the request, one written here);
- the notice (source, seen at, not-after, detail) and every new state line of the
  watcher go into the run's record (`RunRecord.preemption`); a notice whose
  not-after leaves less than the proof timeout of its stop is marked short, and the
  run's message says so.

Everything here reads job-written bytes: garbage is logged and ignored, never
raised, and never stops the tick of another run.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from schemas import (
    JobStatus,
    Preemption,
    ProofInvalid,
    ProofSaved,
    RunNotice,
    RunRecord,
    RunwardenError,
    SnapshotReason,
    StopPhase,
    StopState,
    StoreError,
    WatcherState,
    parse_proof,
)
from schemas.preemption import derived_not_after, parse_not_after, short_notice
from schemas.text import clean_text
from store import Offsets

from .cancel_mark import cancelling_now
from .context import Context, utcnow
from .executors import (
    ExecError,
    Executor,
    FollowEntry,
    FollowUpdate,
    ProtocolError,
    parse_notice,
    parse_notice_state,
)
from .finish import finish, judge_proofs
from .stops import notice_request, proof_seen, request_snapshot

log = logging.getLogger("runwarden")

PROOF_REREAD_S: Final = 5.0
"""How long a follow tick trusts that a proof it read and found not valid (yet) is
the same while its file's size and modification time are, in seconds: it is read and
judged again after that, for a checkpoint completed after its proof."""
_PROOFS_KEPT: Final = 100_000
"""Most runs whose last proof read a worker process remembers (it forgets them all
past that: a cost, never a wrong answer)."""

__all__ = [
    "PROOF_REREAD_S",
    "notice_asker",
    "observe_notices",
    "read_notice",
    "read_watcher",
    "watch_target",
    "watched_targets",
]


def watched_targets(ctx: Context) -> list[str]:
    """The targets with at least one followed run (the fan-out of a tick)."""
    return ctx.store.follow.targets()


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
    ids = ctx.store.follow.runs(target)
    runs: list[RunRecord] = []
    for run_id, found in zip(ids, ctx.records(ids), strict=True):
        if found is None or found.job is None or found.state.is_terminal:
            ctx.store.follow.remove(run_id, target)
            continue
        runs.append(found)
    if not runs:
        return {"runs": 0}
    executor = ctx.executor(target)
    offsets = ctx.store.follow.offsets_many([run.id for run in runs])
    stops = ctx.store.stops.get_many([run.id for run in runs])
    entries = [
        FollowEntry(run.job, o.log, o.metrics, _waits_for_proof(stop), _proof_seen(ctx, run, stop))
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
    proofs = _new_proofs(ctx, executor, runs, stops, updates)
    items = list(zip(runs, offsets, updates, stops, strict=True))
    # Ended runs first, then every other run's lines, then what the others asked: a
    # tick that opens many stops (one deadline shared by many runs) delays no end and
    # no progress behind them.
    ends = [item for item in items if _finished(item[2])]
    others = [item for item in items if not _finished(item[2])]
    ended = sum(max(0, _step(ctx, item, _record_and_act, executor, now)) for item in ends)
    recorded = [item for item in others if _step(ctx, item, _record_lines, executor, now) >= 0]
    for item in recorded:
        run, _, _, stop = item
        if _step(ctx, item, _act, executor, now) < 0:
            continue
        proof = proofs.get(run.id)
        if proof is not None and stop is not None:
            try:
                proof_seen(ctx, stop, proof, seen, "follow")
            except (StoreError, ExecError) as error:
                ctx.proofs_read.pop(run.id, None)  # read again next tick
                log.warning("run %s: this tick failed: %s", run.id, error)
    return {"runs": len(runs), "ended": ended}


_Item = tuple[RunRecord, Offsets, FollowUpdate, "StopState | None"]
"""One run of a tick: its record, offsets, what the tick read, its stop as read."""
_Step = Callable[[Context, _Item, Executor, datetime], int]


def _finished(update: FollowUpdate) -> bool:
    return isinstance(update.status, JobStatus) and update.status.is_finished


def _step(ctx: Context, item: _Item, step: _Step, executor: Executor, now: datetime) -> int:
    """Runs one `step` of the tick for one run: what it returns (1 when the run
    ended), or -1 when it failed. Redis or the target failing leaves the run to the
    next tick (its proof read again too); anything else comes from what the job
    wrote, that run's own, never the others': the bytes a step recording them could
    not record are skipped, so the next tick does not fail again."""
    run, offset, update, _ = item
    try:
        return step(ctx, item, executor, now)
    except (StoreError, ExecError) as error:
        ctx.proofs_read.pop(run.id, None)
        log.warning("run %s: this tick failed: %s", run.id, error)
    except Exception as error:
        log.exception("run %s: what its job wrote could not be taken", run.id)
        if step is not _act:
            _skip(ctx, run, offset, update, error)
    return -1


def _waits_for_proof(stop: StopState | None) -> bool:
    return stop is not None and stop.phase is StopPhase.WAITING_PROOF


def _proof_seen(ctx: Context, run: RunRecord, stop: StopState | None) -> str:
    """The signature of `run`'s proof this process read last, while its stop waits
    for one and for at most [`PROOF_REREAD_S`]; else "" (read it). A run whose stop
    does not wait is forgotten."""
    if not _waits_for_proof(stop):
        ctx.proofs_read.pop(run.id, None)
        return ""
    signature, read_at = ctx.proofs_read.get(run.id, ("", 0.0))
    return signature if time.monotonic() - read_at < PROOF_REREAD_S else ""


def _new_proofs(
    ctx: Context,
    executor: Executor,
    runs: list[RunRecord],
    stops: list[StopState | None],
    updates: list[FollowUpdate],
) -> dict[str, ProofSaved]:
    """The valid proofs this tick read of running jobs whose stop waits for its proof,
    by run id, each checkpoint judged by the one rule (`workers.finish.judge_proofs`:
    one script for them all). A proof not yet valid is left for a later tick or the
    proof deadline, and its signature remembered (`ctx.proofs_read`): it is not read
    again while it stays the same, for [`PROOF_REREAD_S`]. A failure to judge is
    logged, and leaves them all for next time. Never raises for what a job wrote."""
    if len(ctx.proofs_read) > _PROOFS_KEPT:
        ctx.proofs_read.clear()
    now = time.monotonic()
    read: list[tuple[RunRecord, ProofSaved, str]] = []
    for run, stop, update in zip(runs, stops, updates, strict=True):
        if not _waits_for_proof(stop) or update.proof is None:
            continue
        if not isinstance(update.status, JobStatus) or update.status.kind != "running":
            continue  # ended (its end reads and judges the proof itself), or unknown
        parsed = parse_proof(update.proof)
        if isinstance(parsed, ProofSaved):
            read.append((run, parsed, update.proof_sig))
        elif update.proof_sig:
            ctx.proofs_read[run.id] = (update.proof_sig, now)
    if not read:
        return {}
    found = {}
    judgements = judge_proofs(executor, [(run, proof) for run, proof, _ in read])
    for (run, _, signature), judged in zip(read, judgements, strict=True):
        if isinstance(judged, ProofSaved):
            found[run.id] = judged
        elif isinstance(judged, ProofInvalid):
            log.info("run %s: its proof is not valid (yet): %s", run.id, judged.why)
            if signature:
                ctx.proofs_read[run.id] = (signature, now)
    return found


def _record_lines(ctx: Context, item: _Item, executor: Executor, now: datetime) -> int:
    """Records the new log lines and metrics one tick read of its run."""
    run, offset, update, _ = item
    lines, used_log = update.log_lines()
    metric_lines, used_metrics = update.metrics_lines()
    metrics, dropped = _records(metric_lines)
    if dropped:
        lines.append(f"runwarden: {dropped} metrics line(s) ignored: not a JSON object")
    if used_log or used_metrics:
        ctx.store.follow.record_tail(
            run.id,
            lines=lines,
            records=metrics,
            from_offsets=offset,
            to_offsets=Offsets(offset.log + used_log, offset.metrics + used_metrics),
        )
    return 0


def _act(ctx: Context, item: _Item, executor: Executor, now: datetime) -> int:
    """Acts on what one tick found for its run past its lines: a notice, a request
    someone else wrote (a stop opened for each, the notice's first), its end; 1 when
    it ended, else 0."""
    run, _, update, _ = item
    if update.scheduler is not None and update.scheduler != run.scheduler:
        _record_scheduler(ctx, run.id, update.scheduler)
    observe_notices(ctx, run, update, now)  # a cloud's notice opens its stop first
    if update.request is not None and ctx.store.stops.get(run.id) is None:
        notice_request(ctx, run, update.request, now)
    if _finished(update):
        assert isinstance(update.status, JobStatus)
        if cancelling_now(ctx, run.id):
            # The cancel records the end itself, from its own reading once its sweep is
            # done: a dead group says `cancelled` while the sweep still waits to SIGKILL
            # an escaped process deaf to SIGTERM, and a dead job's `exit_code` may be
            # one it forged before the kill. A cancel that dies lapses in
            # CANCEL_RETRY_S; the end recorded then ends what is left (`finish`).
            return 0
        if not _confirmed(run, update.status, executor):
            return 0
        finish(ctx, run, update.status, executor, proof=update.final_proof, job_end=update.job_end)
        return 1
    if not isinstance(update.status, JobStatus):
        log.warning("run %s: %s", run.id, update.status)
    return 0


def _record_scheduler(ctx: Context, run_id: str, said: str) -> None:
    """Records what the target's scheduler says of run `run_id`'s job, when it changed."""

    def mutate(current: RunRecord) -> RunRecord | None:
        if current.scheduler == said:
            return None
        return current.model_copy(update={"scheduler": said})

    ctx.store.runs.update(run_id, mutate)


def _confirmed(run: RunRecord, seen: JobStatus, executor: Executor) -> bool:
    """Whether the status path (a script of its own, which reads no byte a job wrote
    into the follow's stream) says too that the job of `run` ended: an end is recorded
    only then, never on the follow's word alone. When it does not, the end waits for
    the next tick (and is said in the log).

    Raises:
        ExecError: the target could not be read (the tick's error: retried next time).
    """
    assert run.job is not None  # a followed run has its job
    status = executor.status(run.job)
    if status.is_finished:
        return True
    log.warning("run %s: the follow saw it %s, its status is %s: not ended", run.id, seen, status)
    return False


def _record_and_act(ctx: Context, item: _Item, executor: Executor, now: datetime) -> int:
    """Both steps for a run that ended: its last lines, then its end."""
    _record_lines(ctx, item, executor, now)
    return _act(ctx, item, executor, now)


def _skip(
    ctx: Context, run: RunRecord, offset: Offsets, update: FollowUpdate, error: Exception
) -> None:
    """Moves `run`'s offsets past what this tick read, with a note in its log stream
    saying why; never raises (logged)."""
    _, used_log = update.log_lines()
    _, used_metrics = update.metrics_lines()
    note = f"runwarden: {used_log + used_metrics} bytes skipped: {type(error).__name__}"
    try:
        ctx.store.follow.record_tail(
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


def notice_asker(notice: RunNotice) -> str:
    """The `asked_by` of the stop a notice opened: `notice:<source>`."""
    return f"notice:{notice.source}"


def read_notice(data: bytes | None, now: datetime) -> RunNotice | None:
    """The notice in the bytes of a `notice.json` (None when there is none); recorded
    at `now`. Its not-after is ISO 8601 UTC whatever form the cloud wrote it in; a
    GCP notice, which carries none, gets the one its cloud documents, derived from
    when it was seen (`schemas.preemption.DOCUMENTED_LEAD_S`).

    Raises:
        ProtocolError: the bytes are not a notice.
    """
    if data is None:
        return None
    found = parse_notice(data)
    seen_at = None
    if found.seen_at is not None:
        try:
            seen_at = datetime.fromtimestamp(found.seen_at, UTC)
        except (OverflowError, OSError, ValueError):
            seen_at = None  # a clock the watcher could not have read: unknown
    given = None if found.not_after is None else clean_text(found.not_after)
    not_after, derived = given, False
    if given is None:
        # GCP's notices carry no time: its documented lead, from when it was seen.
        not_after = derived_not_after(found.source, seen_at or now)
        derived = not_after is not None
    elif parse_not_after(given) is None:
        log.warning("notice %s: its not-after %r is no time", found.source, given[:64])
    return RunNotice.model_validate(
        {
            "source": found.source,
            "seen_at": seen_at,
            "not_after": not_after,
            "not_after_derived": derived,
            "detail": None if found.detail is None else clean_text(found.detail),
            "recorded_at": now,
        }
    )


def read_watcher(data: bytes | None) -> WatcherState | None:
    """The watcher's state in the bytes of a `notice.state` (None when there is
    none), its text made safe to show.

    Raises:
        ProtocolError: the line is not a state.
    """
    if data is None:
        return None
    found = parse_notice_state(data)
    return WatcherState(kind=found.kind, text=clean_text(found.text).strip()[:200])


def observe_notices(ctx: Context, run: RunRecord, update: FollowUpdate, now: datetime) -> None:
    """What one follow tick found of `run`'s notice watcher: opens the stop of a first
    notice, then records the notice and the watcher's state (module docstring).
    Never raises for the job's bytes (logged); the store's and the target's errors
    propagate (the tick tries again)."""
    try:
        notice = read_notice(update.notice, now)
    except ProtocolError as error:
        log.warning("run %s: its notice cannot be read: %s", run.id, error)
        notice = None
    try:
        watcher = read_watcher(update.notice_state)
    except ProtocolError as error:
        log.warning("run %s: its notice watcher's state cannot be read: %s", run.id, error)
        watcher = None
    if notice is None and watcher is None:
        return
    known = run.preemption or Preemption()
    first = notice if notice is not None and known.notice is None else None
    budget_s = ctx.settings.proof_timeout_s
    if first is not None:
        stop = _ask(ctx, run, update, first, now)
        if stop is not None:
            # The proof timeout of the stop the notice opened: the one that counts.
            budget_s = (stop.proof_deadline - stop.asked_at).total_seconds()
        first = short_notice(first, budget_s)
        text = f"{first.source} notice"
        if first.not_after:
            text += f" (not after {first.not_after})"
        log.warning("run %s: %s%s", run.id, text, f": {first.note}" if first.note else "")
    if first is None and (watcher is None or watcher == known.watcher):
        return
    _record(ctx, run.id, first, watcher)


def _ask(
    ctx: Context, run: RunRecord, update: FollowUpdate, notice: RunNotice, now: datetime
) -> StopState | None:
    """The stop a first notice opens, asked by its source, or the stop already open
    (whoever asked first keeps it); None when none could be opened."""
    stop = ctx.store.stops.get(run.id)
    if stop is not None or not run.snapshots:
        return stop
    asker = notice_asker(notice)
    if update.request is not None:
        # The watcher asks only where no request was; another's request keeps its
        # reason and asker (the follow opens its stop as any request's).
        if SnapshotReason.parse(update.request) is SnapshotReason.PREEMPTED:
            notice_request(ctx, run, update.request, now, asked_by=asker)
        return ctx.store.stops.get(run.id)
    if not isinstance(update.status, JobStatus) or update.status.is_finished:
        return None  # the job ended (or cannot be read): nobody would answer now
    # The notice, not yet its request (the tick read between the watcher's two
    # writes, or the watcher could not write it): ask at once, as it would.
    try:
        # The watcher may write its request meanwhile: that one is the notice's too.
        return request_snapshot(
            ctx,
            run.id,
            SnapshotReason.PREEMPTED,
            asker,
            now,
            only_if_none_open=True,
            found_by=asker,
        )
    except RunwardenError as error:
        log.warning("run %s: cannot ask for the snapshot of its notice: %s", run.id, error)
        return ctx.store.stops.get(run.id)


def _record(
    ctx: Context, run_id: str, notice: RunNotice | None, watcher: WatcherState | None
) -> None:
    """Records in run `run_id`'s record its first `notice` (and, when it is short and
    the run still runs, says so in its message) and the watcher's state."""

    def mutate(current: RunRecord) -> RunRecord | None:
        known = current.preemption or Preemption()
        changes: dict[str, object] = {}
        if watcher is not None and watcher != known.watcher:
            changes["watcher"] = watcher
        if notice is not None and known.notice is None:
            changes["notice"] = notice
        if not changes:
            return None
        update: dict[str, object] = {"preemption": known.model_copy(update=changes)}
        short = notice is not None and notice.short and "notice" in changes
        if short and notice is not None and not current.state.is_terminal:
            update["message"] = notice.note
        return current.model_copy(update=update)

    ctx.store.runs.update(run_id, mutate)
