"""The stop ledger's events: what happened to a run's stops, told once, kept as long
as the run's record, counted in the metrics and sent to the webhooks that want it
(docs/architecture.md, "The ledger, webhooks and metrics").

Every event is a frozen pydantic model with a `kind` (the discriminator of
[`LedgerEvent`]), a random `id` (a receiver drops a delivery it has seen), the run,
the time it happened (`at`, UTC) and, when it belongs to one, the stop's id:

    stop_opened       a stop was opened (asked by a producer, a policy, or a request
                      found in the run directory): reason, asked_by, proof_deadline,
                      proof_timeout_s and timeout_source (`explicit`, `learned`,
                      `default`: `schemas.budget`) (`at` is when it was asked)
    proof_seen        the job's proof was seen, by a follow tick, at the proof
                      deadline (`due` set) or at the run's end: step, checkpoint,
                      asked_at, due, end_deadline, seen_at, seen_by (`at` is when
                      the proof was written, bounded by asked_at and seen_at)
    cancel_decided    a deadline passed (proof_timeout, end_timeout), a person
                      cancelled (manual), or a failed cancel is tried again (retry):
                      cause, due, attempt, note, asked_by (a manual one's producer)
    job_cancelled     the job was signalled and its group is gone
    run_ended         the run's end was recorded: state, message, snapshot
    retrieval_done    the artifacts came home, verified: files, bytes, attempts, path,
                      checkpoint_digest
    retrieval_failed  a retrieval attempt failed (`gave_up` after the last one):
                      attempts, error, gave_up, next_attempt
    policy_decision   a policy asked a snapshot: policy, why

Texts a job or a target can influence (`note`, `message`, `error`, `why`) are cut to
[`TEXT_MAX`] characters by the constructors, so building an event never fails on
them. The [`checkpoint_digest`] of a retrieval is SHA-256 over the sorted lines
`<path> <sha256>\\n` of the checkpoint's files as the retrieval's `manifest.json`
lists them: the same checkpoint gives the same digest wherever it is stored.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .budget import TimeoutSource
from .ids import RunId
from .run import Artifacts, ArtifactsPhase, RunRecord, RunState
from .snapshot import Snapshot, SnapshotReason
from .stops import AskedBy, StopId, StopPhase, StopState, UtcDatetime

__all__ = [
    "EVENT_KINDS",
    "LEDGER_EVENT",
    "TEXT_MAX",
    "CancelCause",
    "CancelDecided",
    "CancelFailed",
    "EventKind",
    "JobCancelled",
    "LedgerEvent",
    "OpenStop",
    "PolicyDecision",
    "ProofSeen",
    "ProofSeenBy",
    "RetrievalDone",
    "RetrievalFailed",
    "RunEnded",
    "StopOpened",
    "checkpoint_digest",
    "new_event_id",
    "open_stop_of",
    "retrieval_event",
]

TEXT_MAX: Final = 2000
"""Characters kept of a free text in an event (a note, a message, an error, a why)."""

EventKind = Literal[
    "stop_opened",
    "proof_seen",
    "cancel_decided",
    "cancel_failed",
    "job_cancelled",
    "run_ended",
    "retrieval_done",
    "retrieval_failed",
    "policy_decision",
]
EVENT_KINDS: Final[tuple[EventKind, ...]] = (
    "stop_opened",
    "proof_seen",
    "cancel_decided",
    "cancel_failed",
    "job_cancelled",
    "run_ended",
    "retrieval_done",
    "retrieval_failed",
    "policy_decision",
)

CancelCause = Literal["proof_timeout", "end_timeout", "manual", "retry"]
"""Why a cancel was decided: no proof by the proof deadline, no end by the end
deadline, a person's `cancel`, or a cancel that failed being tried again (not a new
cancel: the metrics do not count it)."""

_Text = Annotated[str, Field(max_length=TEXT_MAX)]
_EventId = Annotated[str, Field(pattern=r"^[0-9a-f]{16,64}$")]


def new_event_id() -> str:
    """A fresh event id: 32 random hex digits (128 bits from `secrets`)."""
    return secrets.token_hex(16)


def _cut(text: str | None) -> str | None:
    return None if text is None else text[:TEXT_MAX]


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S")


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: _EventId = Field(default_factory=new_event_id)
    run_id: RunId
    at: UtcDatetime
    """When it happened (for `stop_opened`, when the stop was asked)."""
    stop_id: StopId | None = None
    """The stop it belongs to; None when none was open."""


class StopOpened(_Event):
    """A stop was opened: the job is asked for a snapshot."""

    kind: Literal["stop_opened"] = "stop_opened"
    reason: SnapshotReason
    asked_by: AskedBy
    """The stop's `asked_by`: the producer that signed the request, with what it
    said (`operator/cli`, `billing/nightly-cap`), `policy:<reason>`, `watch` (a
    request found in the run directory)."""
    proof_deadline: UtcDatetime
    proof_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """The proof timeout the stop got (`StopState.budget`); None for a stop without."""
    timeout_source: TimeoutSource | None = None
    """Where it came from: the run's own, learned from its saves, or the default."""

    @classmethod
    def of(cls, stop: StopState) -> StopOpened:
        budget = stop.budget
        return cls(
            run_id=stop.run_id,
            stop_id=stop.stop_id,
            at=stop.asked_at,
            reason=stop.reason,
            asked_by=stop.asked_by,
            proof_deadline=stop.proof_deadline,
            proof_timeout_s=None if budget is None else budget.proof_timeout_s,
            timeout_source=None if budget is None else budget.source,
        )

    def describe(self) -> str:
        text = (
            f"stop opened ({self.reason}, asked by {self.asked_by}); "
            f"proof deadline {_time(self.proof_deadline)}"
        )
        if self.proof_timeout_s is not None and self.timeout_source is not None:
            text += f" ({round(self.proof_timeout_s, 1):g} s, {self.timeout_source})"
        return text


ProofSeenBy = Literal["follow", "deadline", "end"]
"""Who saw a proof first: a follow tick (the job still running), the proof deadline's
task (the job still running), or the run's end."""


class ProofSeen(_Event):
    """The job's proof (a valid `snapshot.json`, its checkpoint a real directory in
    the run directory) was seen. `at` is when the proof was written: its own `time`,
    bounded by `asked_at` and `seen_at` (`schemas.snapshot.proof_moment`)."""

    kind: Literal["proof_seen"] = "proof_seen"
    step: Annotated[int, Field(ge=0)]
    checkpoint: str
    asked_at: UtcDatetime | None = None
    """When its stop was asked (`at - asked_at` is the proof latency)."""
    due: UtcDatetime | None = None
    """The proof deadline, when the proof was first seen there (the job still ran);
    None when a follow tick or the run's end saw it first."""
    end_deadline: UtcDatetime | None = None
    """The end deadline it set (seen while the job still ran): `at` plus the stop's
    end timeout."""
    seen_at: UtcDatetime | None = None
    """When runwarden first saw the proof (None in events recorded before it was
    kept: `at` was that moment then)."""
    seen_by: ProofSeenBy | None = None
    """Who saw it first (None in events recorded before it was kept: `due` told)."""

    @classmethod
    def seen(
        cls,
        stop: StopState,
        snapshot: Snapshot,
        proved_at: datetime,
        *,
        seen_at: datetime,
        by: ProofSeenBy,
        end_deadline: datetime | None = None,
    ) -> ProofSeen:
        """The proof of `stop` written at `proved_at` (already bounded) and first
        seen at `seen_at` by `by`, setting `end_deadline` (the job still running)."""
        return cls(
            run_id=stop.run_id,
            stop_id=stop.stop_id,
            at=proved_at,
            step=snapshot.step,
            checkpoint=snapshot.checkpoint,
            asked_at=stop.asked_at,
            due=stop.proof_deadline if by == "deadline" else None,
            end_deadline=end_deadline,
            seen_at=seen_at,
            seen_by=by,
        )

    @classmethod
    def at_deadline(
        cls, stop: StopState, snapshot: Snapshot, now: datetime, end_deadline: datetime | None
    ) -> ProofSeen:
        """Seen first at the proof deadline of `stop` (at `now`, its written time
        unknown), the job still running."""
        return cls.seen(stop, snapshot, now, seen_at=now, by="deadline", end_deadline=end_deadline)

    def describe(self) -> str:
        by = self.seen_by or ("deadline" if self.due is not None else "end")
        where = {
            "follow": "by the follow",
            "deadline": "at the proof deadline",
            "end": "at the run's end",
        }[by]
        text = f"proof seen {where}: step {self.step}, {self.checkpoint}"
        if self.asked_at is not None:
            took = max(0.0, (self.at - self.asked_at).total_seconds())
            text += f", written {round(took, 1):g} s after it was asked"
        if self.end_deadline is not None:
            text += f"; end deadline {_time(self.end_deadline)}"
        return text


class CancelDecided(_Event):
    """A cancel of the run's job was decided."""

    kind: Literal["cancel_decided"] = "cancel_decided"
    cause: CancelCause
    due: UtcDatetime | None = None
    """The deadline that passed (None for a manual cancel)."""
    attempt: Annotated[int, Field(ge=1)] = 1
    """Cancels tried for this stop, this one included."""
    note: _Text | None = None
    asked_by: AskedBy | None = None
    """Who asked a manual cancel (the producer that sent it); None for a deadline's."""

    @classmethod
    def of(cls, stop: StopState, note: str, now: datetime) -> CancelDecided:
        """Decided on `stop` as it was read (its phase says which deadline passed)."""
        cause: CancelCause
        due: datetime | None
        if stop.phase is StopPhase.WAITING_PROOF:
            cause, due = "proof_timeout", stop.proof_deadline
        elif stop.phase is StopPhase.WAITING_END:
            cause, due = "end_timeout", stop.end_deadline
        else:
            cause, due = "retry", stop.end_deadline
        return cls(
            run_id=stop.run_id,
            stop_id=stop.stop_id,
            at=now,
            cause=cause,
            due=due,
            attempt=stop.cancels + 1,
            note=_cut(note),
        )

    @classmethod
    def manual(cls, run_id: str, now: datetime, asked_by: str | None = None) -> CancelDecided:
        """A person's (or a service's) `cancel`, asked by producer `asked_by`."""
        who = None if not asked_by else asked_by[:100]
        return cls(run_id=run_id, at=now, cause="manual", note="cancel asked", asked_by=who)

    def describe(self) -> str:
        text = f"cancel decided: {self.cause.replace('_', ' ')}"
        if self.asked_by:
            text += f" (asked by {self.asked_by})"
        if self.attempt > 1:
            text += f" (attempt {self.attempt})"
        return text + (f"; {self.note}" if self.note else "")


class CancelFailed(_Event):
    """A cancel of the run's job did not complete (cut at its deadline, its target out
    of reach, a process that survived SIGKILL): the job may still run, and the run's
    stop waits in `cancelling` for the retry. The alert a webhook wants."""

    kind: Literal["cancel_failed"] = "cancel_failed"
    attempt: Annotated[int, Field(ge=1)]
    """Cancels tried for this stop, the failed one included."""
    error: _Text
    retry_in_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    """Seconds until the retry deadline (`reconcile` tries the cancel again then)."""

    @classmethod
    def of(
        cls, stop: StopState, error: str, retry_in_s: float, now: datetime
    ) -> CancelFailed:
        """The failed cancel of `stop` as it stands after the failure (its `cancels`
        counts the failed one)."""
        return cls(
            run_id=stop.run_id,
            stop_id=stop.stop_id,
            at=now,
            attempt=max(1, stop.cancels),
            error=error[:TEXT_MAX] or "unknown error",
            retry_in_s=retry_in_s,
        )

    def describe(self) -> str:
        return (
            f"cancel failed (attempt {self.attempt}): {self.error}; "
            f"retried in {self.retry_in_s:g} s"
        )


class JobCancelled(_Event):
    """The run's job was cancelled: signalled, and its process group gone."""

    kind: Literal["job_cancelled"] = "job_cancelled"

    @classmethod
    def of(cls, run_id: str, now: datetime) -> JobCancelled:
        return cls(run_id=run_id, at=now)

    def describe(self) -> str:
        return "job cancelled"


class RunEnded(_Event):
    """The run's end was recorded."""

    kind: Literal["run_ended"] = "run_ended"
    state: RunState
    message: _Text | None = None
    snapshot: Snapshot | None = None

    @classmethod
    def of(cls, run: RunRecord, now: datetime) -> RunEnded:
        """`run` as its end was recorded (`at`: its `ended` time, else `now`)."""
        return cls(
            run_id=run.id,
            at=run.ended or now,
            state=run.state,
            message=_cut(run.message),
            snapshot=run.snapshot,
        )

    def describe(self) -> str:
        text = f"run ended {self.state}"
        if self.snapshot is not None:
            text += f" with {self.snapshot.checkpoint} (step {self.snapshot.step})"
        return text + (f": {self.message}" if self.message else "")


class RetrievalDone(_Event):
    """The run's artifacts are in the artifact store, verified."""

    kind: Literal["retrieval_done"] = "retrieval_done"
    files: Annotated[int, Field(ge=0)]
    bytes: Annotated[int, Field(ge=0)]
    attempts: Annotated[int, Field(ge=0)]
    path: str | None = None
    checkpoint_digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    """SHA-256 over the checkpoint's `<path> <sha256>` lines ([`checkpoint_digest`]);
    None for a run without a snapshot."""

    def describe(self) -> str:
        text = f"artifacts retrieved: {self.files} files, {self.bytes} bytes"
        if self.checkpoint_digest is not None:
            text += f"; checkpoint digest {self.checkpoint_digest[:16]}"
        return text


class RetrievalFailed(_Event):
    """A retrieval attempt failed."""

    kind: Literal["retrieval_failed"] = "retrieval_failed"
    attempts: Annotated[int, Field(ge=0)]
    error: _Text | None = None
    gave_up: bool = False
    """The last attempt failed: the retrieval is marked failed (`runwarden retrieve`
    tries again)."""
    next_attempt: UtcDatetime | None = None

    def describe(self) -> str:
        head = "retrieval given up" if self.gave_up else "retrieval attempt failed"
        return f"{head} after {self.attempts} attempt(s): {self.error or 'unknown error'}"


class PolicyDecision(_Event):
    """A policy asked the run's job for a snapshot."""

    kind: Literal["policy_decision"] = "policy_decision"
    policy: SnapshotReason
    why: _Text

    @classmethod
    def of(cls, run_id: str, policy: SnapshotReason, why: str, now: datetime) -> PolicyDecision:
        return cls(run_id=run_id, at=now, policy=policy, why=why[:TEXT_MAX])

    def describe(self) -> str:
        return f"policy {self.policy} asks a snapshot: {self.why}"


LedgerEvent = Annotated[
    StopOpened
    | ProofSeen
    | CancelDecided
    | CancelFailed
    | JobCancelled
    | RunEnded
    | RetrievalDone
    | RetrievalFailed
    | PolicyDecision,
    Field(discriminator="kind"),
]
"""Any event of the ledger, read by its `kind`."""

LEDGER_EVENT: Final[TypeAdapter[LedgerEvent]] = TypeAdapter(LedgerEvent)
"""Validates and reads a [`LedgerEvent`] (`LEDGER_EVENT.validate_json(raw)`)."""


def checkpoint_digest(files: Iterable[tuple[str, str]], checkpoint: str) -> str | None:
    """SHA-256 (hex) over the sorted lines `<path> <sha256>\\n` of the `(path,
    sha256)` pairs of `files` that are `checkpoint` or under it (paths relative to
    the run directory, as a retrieval's `manifest.json` lists them); None when none
    is. Paths are written with `backslashreplace`, so a name that is not UTF-8
    still digests."""
    prefix = checkpoint.rstrip("/") + "/"
    lines = sorted(
        f"{path} {sha256}\n"
        for path, sha256 in files
        if path == checkpoint or path.startswith(prefix)
    )
    if not lines:
        return None
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8", "backslashreplace"))
    return digest.hexdigest()


def retrieval_event(
    run: RunRecord, result: Artifacts, now: datetime, digest: str | None = None
) -> RetrievalDone | RetrievalFailed | None:
    """The event of a retrieval attempt of `run` that recorded `result`; None when
    `result` says nothing happened (still pending without an error: a duplicate
    task)."""
    if result.phase is ArtifactsPhase.DONE:
        return RetrievalDone(
            run_id=run.id,
            at=result.retrieved or now,
            files=result.files,
            bytes=result.bytes,
            attempts=result.attempts,
            path=result.path,
            checkpoint_digest=digest,
        )
    if result.error is None:
        return None
    return RetrievalFailed(
        run_id=run.id,
        at=now,
        attempts=result.attempts,
        error=_cut(result.error),
        gave_up=result.phase is ArtifactsPhase.FAILED,
        next_attempt=result.next_attempt,
    )


@dataclass(frozen=True)
class OpenStop:
    """The stop a run's ledger says is open: opened and its run not ended since."""

    stop_id: str
    asked_at: datetime
    proved: bool
    """A `proof_seen` of this stop is in the ledger."""


def open_stop_of(events: Sequence[LedgerEvent]) -> OpenStop | None:
    """The open stop of the run whose ledger (or its newest part, oldest first) is
    `events`: the newest `stop_opened` with no `run_ended` after it; None when there
    is none."""
    found: OpenStop | None = None
    for event in events:
        if isinstance(event, StopOpened) and event.stop_id is not None:
            found = OpenStop(event.stop_id, event.at, proved=False)
        elif isinstance(event, RunEnded):
            found = None
        elif isinstance(event, ProofSeen) and found is not None and event.stop_id == found.stop_id:
            found = OpenStop(found.stop_id, found.asked_at, proved=True)
    return found
