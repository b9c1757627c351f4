"""Stops in flight: the durable state of one graceful stop and its deadlines
(docs/architecture.md, "Durability").

A stop is opened when a snapshot is asked for (by the CLI, a policy, or a request
someone else wrote into the run directory) and lives until the run ends or the stop
is given up. Its phases:

    waiting_proof --(proof seen, job still running)--> waiting_end
          |                                                 |
          +--(no proof by the proof deadline)--+            +--(end deadline passed)--+
                                               v                                      v
                                           cancelling <-------------------------------+
    any open phase --(the run ended / the stop was closed)--> done

Every model here is JSON-serialisable (`model_dump_json` / `model_validate_json`);
datetimes are timezone-aware UTC (a naive datetime is read as UTC).
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .budget import StopBudget
from .ids import RunId
from .snapshot import SnapshotReason

__all__ = [
    "STOP_ID_PATTERN",
    "Deadline",
    "DeadlineKind",
    "StopId",
    "StopPhase",
    "StopState",
    "UtcDatetime",
    "new_stop_id",
]


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_utc)]
"""A datetime normalised to UTC; a naive one is taken to be UTC already."""

STOP_ID_PATTERN: Final = r"[A-Za-z0-9_-]{8,64}"
_STOP_ID = re.compile(STOP_ID_PATTERN)


def _check_stop_id(value: str) -> str:
    if _STOP_ID.fullmatch(value) is None:
        raise ValueError(f"invalid stop id {value[:80]!r}: use 8-64 letters, digits, '_' or '-'")
    return value


StopId = Annotated[str, AfterValidator(_check_stop_id)]
"""The random token naming one stop of a run: 8 to 64 of `[A-Za-z0-9_-]`, so never
holding `|` (the separator of a deadline's member in Redis)."""


def new_stop_id() -> str:
    """A fresh stop id: 16 random hex digits (64 bits from `secrets`)."""
    return secrets.token_hex(8)


def _check_text(value: str) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("control characters are not allowed here")
    return value


AskedBy = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_check_text)]


class StopPhase(StrEnum):
    """Where a stop stands."""

    WAITING_PROOF = "waiting_proof"
    """The request is written; the proof deadline is pending."""
    WAITING_END = "waiting_end"
    """The proof was seen while the job still ran; the end deadline is pending."""
    CANCELLING = "cancelling"
    """A deadline passed: the job is being cancelled."""
    DONE = "done"
    """Closed: the run ended or the stop was given up. A done stop is only found in
    a run's stop history, never as its open stop."""

    @property
    def is_open(self) -> bool:
        """Whether the stop still needs something to happen (every phase but done)."""
        return self is not StopPhase.DONE


DeadlineKind = Literal["proof", "end"]
"""`proof`: the proof timeout of a stop (cancel a job that neither proved nor ended).
`end`: the end timeout (cancel a job that proved but still runs; also used to retry
a cancel that a dead worker left unfinished)."""


class StopState(BaseModel):
    """The durable state of one stop of a run. A run has at most one open stop."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: RunId
    stop_id: StopId
    """Random token naming this stop; a task carries it, so a task meant for an older
    stop of the same run changes nothing."""
    phase: StopPhase
    reason: SnapshotReason
    """The reason written into `snapshot.request`. The first one asked, unless a caller
    explicitly replaced it."""
    asked_by: AskedBy
    """Who asked, for people: `cli`, `poll` (a request found in the run directory),
    `policy:cost`, `policy:deadline`, `policy:disk`, a service name..."""
    asked_at: UtcDatetime
    proof_deadline: UtcDatetime
    """When the proof timeout fires: `asked_at` plus the proof limit."""
    end_deadline: UtcDatetime | None = None
    """When the end timeout fires, once the proof was seen (or a cancel is retried)."""
    closed_at: UtcDatetime | None = None
    """When the stop was closed (phase done)."""
    note: Annotated[str, Field(max_length=2000)] | None = None
    """The last thing that happened, for people: "proof at step 40", "cancelled"..."""
    cancels: Annotated[int, Field(ge=0)] = 0
    """Cancels tried for this stop: a failed one is retried after a delay that doubles
    with each try."""
    budget: StopBudget | None = None
    """The proof and end timeouts this stop got, and why (`schemas.budget`); None in
    a stop opened without one (the configured timeouts then apply)."""


class Deadline(BaseModel):
    """One pending deadline of a stop, as held in the deadlines sorted set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: RunId
    stop_id: StopId
    kind: DeadlineKind
    due: UtcDatetime

    @property
    def member(self) -> str:
        """The sorted-set member naming this deadline: `run_id|stop_id|kind`. Neither
        a run id nor a stop id can hold `|`, so the member is unambiguous."""
        return f"{self.run_id}|{self.stop_id}|{self.kind}"

    @classmethod
    def from_member(cls, member: str, due: datetime) -> Deadline:
        """The deadline a sorted-set member names, due at `due`.

        Raises:
            ValueError: (pydantic's `ValidationError` included) for a member that is
                not `run_id|stop_id|kind`.
        """
        parts = member.split("|")
        if len(parts) != 3:
            raise ValueError(f"not a deadline member: {member[:200]!r}")
        run_id, stop_id, kind = parts
        return cls.model_validate({"run_id": run_id, "stop_id": stop_id, "kind": kind, "due": due})
