"""The event seam: the one function the run operations call at each point that
matters ([`emit`]), which records a typed ledger event (`schemas.ledger`): appended
to its run's ledger, counted in the metrics, and queued for every webhook that
wants it, in one transaction (`RunStore.record_event`); and [`observe_tick`], the
follow tick's duration.

Guarantees:

- **Never breaks a stop.** Building the event and recording it run inside [`emit`],
  which never raises: a failure (Redis, a malformed event) is logged and the
  operation goes on. A worker killed between a state change and its `emit` loses
  that event (the state is still right: the ledger tells, it does not decide).
- **Fast.** Two Redis round trips at most (a read of the run's newest ledger
  entries, when the event needs its stop; the transaction); delivery happens on
  threads of their own (`workers.webhooks`), never in the operation.
- **Completed from the ledger.** An event that does not know its stop (a manual
  cancel, a job cancelled, a run's end) gets the stop the ledger says is open; a
  retrieval, or a job cancelled after its run's end was recorded, gets the stop the
  run ended with. A run that ended with a snapshot while
  its stop had no `proof_seen` gets one first (the proof seen at the run's end), so
  every stop's proof is in the ledger and in the proof latency histogram; the run's
  end tells its own (`workers.finish`, with the proof's time), and a `proof_seen`
  by the end is dropped when the ledger already has this stop's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Final, ParamSpec

from schemas import Artifacts, RunRecord
from schemas.ledger import (
    CancelDecided,
    CancelFailed,
    LedgerEvent,
    PolicyDecision,
    ProofSeen,
    RetrievalDone,
    RetrievalFailed,
    RunEnded,
    StopOpened,
    checkpoint_digest,
    open_stop_of,
    retrieval_event,
)
from schemas.metrics import FOLLOW_TICK, Sample, event_samples

from .context import Context
from .errors import RetrievalError
from .retrieval import stored_files

log = logging.getLogger("runwarden")

__all__ = ["LEDGER_TAIL", "emit", "observe_tick", "retrieved", "slack_text"]

LEDGER_TAIL: Final = 64
"""Newest entries of a run's ledger read to find the stop an event belongs to."""

_P = ParamSpec("_P")


def emit(
    ctx: Context,
    build: Callable[_P, LedgerEvent | None],
    /,
    *args: _P.args,
    **kwargs: _P.kwargs,
) -> None:
    """Records the event `build(*args, **kwargs)` makes (nothing for None). Never
    raises: a failure is logged, and the caller's operation goes on."""
    try:
        event = build(*args, **kwargs)
        if event is not None:
            _record(ctx, event)
    except Exception:  # the ledger tells, it never breaks a stop
        what = getattr(build, "__qualname__", "?")
        log.exception("the ledger could not record an event (%s)", what)


def _record(ctx: Context, event: LedgerEvent) -> None:
    for done in _completed(ctx, event):
        hooks = [hook for hook in ctx.webhooks.hooks if hook.wants(done.kind)]
        deliveries = [(hook.name, _delivery(done, hook.format)) for hook in hooks]
        ctx.store.ledger.record(done, event_samples(done), deliveries)
        if deliveries:
            ctx.webhooks.start()


def _completed(ctx: Context, event: LedgerEvent) -> list[LedgerEvent]:
    """`event` with its stop filled in from the run's ledger, preceded by the
    `proof_seen` a run's end with a snapshot implies."""
    if isinstance(event, ProofSeen) and event.seen_by == "end":
        # The run's end tells a proof no one saw before: unless a follow tick or the
        # deadline told it meanwhile (they race the end by one read).
        found = open_stop_of(ctx.store.ledger.events(event.run_id, last=LEDGER_TAIL))
        return [] if found is not None and found.proved else [event]
    if isinstance(event, StopOpened | PolicyDecision | ProofSeen | CancelFailed):
        return [event]
    if isinstance(event, CancelDecided) and event.stop_id is not None:
        return [event]
    tail = ctx.store.ledger.events(event.run_id, last=LEDGER_TAIL)
    found = open_stop_of(tail)
    if found is None or isinstance(event, RetrievalDone | RetrievalFailed):
        # After the run's end: a retrieval, or a cancel whose end a follow tick
        # recorded first, belongs to the stop the run ended with.
        ended = [e for e in tail if isinstance(e, RunEnded)]
        stop_id = ended[-1].stop_id if ended and not isinstance(event, RunEnded) else None
        return [event.model_copy(update={"stop_id": stop_id})]
    event = event.model_copy(update={"stop_id": found.stop_id})
    if isinstance(event, RunEnded) and event.snapshot is not None and not found.proved:
        proof = ProofSeen(
            run_id=event.run_id,
            stop_id=found.stop_id,
            at=event.at,
            step=event.snapshot.step,
            checkpoint=event.snapshot.checkpoint,
            asked_at=found.asked_at,
        )
        return [proof, event]
    return [event]


def _delivery(event: LedgerEvent, form: str) -> str:
    """The queued delivery of `event` for a webhook of format `form`: its id, kind,
    run and rendered body (the event's JSON, or Slack's `{"text": ...}`)."""
    body = event.model_dump_json() if form == "json" else json.dumps({"text": slack_text(event)})
    return json.dumps({"id": event.id, "kind": event.kind, "run_id": event.run_id, "body": body})


def slack_text(event: LedgerEvent) -> str:
    """`event` as one Slack message line; `&`, `<` and `>` escaped as Slack asks, so
    a job's text never mentions a channel or makes a link."""
    line = f"runwarden: run {event.run_id}: {event.describe()}"
    return line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def retrieved(run: RunRecord, result: Artifacts, now: datetime) -> LedgerEvent | None:
    """The event of a retrieval attempt of `run` that gave `result`; a retrieval done
    for a run with a snapshot carries its checkpoint's digest, from the stored
    `manifest.json` ([`schemas.ledger.checkpoint_digest`]; None when that cannot be
    read, logged)."""
    digest = None
    if result.path is not None and run.snapshot is not None and result.phase == "done":
        try:
            files = stored_files(Path(result.path)) or []
        except RetrievalError as error:
            # Told without its digest rather than not at all.
            log.warning("run %s: no checkpoint digest: %s", run.id, error)
            files = []
        digest = checkpoint_digest(((f.path, f.sha256) for f in files), run.snapshot.checkpoint)
    return retrieval_event(run, result, now, digest)


def observe_tick(ctx: Context, target: str, seconds: float) -> None:
    """Counts one follow tick of `target` that took `seconds`. Never raises."""
    try:
        ctx.store.counters.add([Sample(FOLLOW_TICK, (target,), max(0.0, seconds))])
    except Exception:  # noqa: BLE001 - a lost sample never breaks a tick
        log.warning("target %s: cannot count the follow tick", target)
