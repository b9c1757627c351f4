"""Preemption notices in the follow: what a tick does with the notice watcher's files
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

import logging
from datetime import UTC, datetime

from schemas import (
    JobStatus,
    Preemption,
    RunNotice,
    RunRecord,
    RunwardenError,
    SnapshotReason,
    StopState,
    WatcherState,
)
from schemas.preemption import derived_not_after, parse_not_after, short_notice
from schemas.text import clean_text

from .context import Context
from .executors import FollowUpdate, ProtocolError, parse_notice, parse_notice_state
from .stops import notice_request, request_snapshot

log = logging.getLogger("runwarden")

__all__ = ["notice_asker", "observe_notices", "read_notice", "read_watcher"]


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


def observe_notices(
    ctx: Context, run: RunRecord, update: FollowUpdate, now: datetime
) -> None:
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
    stop = ctx.store.get_stop(run.id)
    if stop is not None or not run.snapshots:
        return stop
    asker = notice_asker(notice)
    if update.request is not None:
        # The watcher asks only where no request was; another's request keeps its
        # reason and asker (the follow opens its stop as any request's).
        if SnapshotReason.parse(update.request) is SnapshotReason.PREEMPTED:
            notice_request(ctx, run, update.request, now, asked_by=asker)
        return ctx.store.get_stop(run.id)
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
        return ctx.store.get_stop(run.id)


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

    ctx.store.update_run(run_id, mutate)
