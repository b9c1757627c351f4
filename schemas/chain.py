"""Preempted runs continued elsewhere: what a launch asks for (`OnPreempt`), where a
run's continuation stands (`Continuation`), and the pure rules that decide it.

A run launched with `on_preempt` (`runwarden launch --on-preempt resume`) that ends
*preempted*, that is with a snapshot whose reason is `preempted` (its job saved on a
cloud's notice or a preemption signal; the run is `stopped`, or `failed` when the
job saved and then died with its machine), is resumed from its verified checkpoint
on the first available target of its list, with no person involved. The runs so
linked (`RunRecord.resumed_from`) form a *chain*; its preemptions are counted apart
from its failures: a failure, or any other reason, never continues a run, and a
chain stops continuing after `max_preemptions` preemptions.

The order of the targets tried (`candidate_targets`): the list as given, with the
target the run was just preempted on moved last (a machine that received a notice is
going away; it is still tried when it is the only one, or the others are gone).
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .defaults import DEFAULT_MAX_PREEMPTIONS
from .snapshot import Snapshot, SnapshotReason
from .targets import TargetName

__all__ = [
    "CONTINUE_RETRY_S",
    "DEFAULT_MAX_PREEMPTIONS",
    "MAX_CHAIN",
    "Continuation",
    "ContinuationPhase",
    "OnPreempt",
    "candidate_targets",
    "continuation_key",
    "is_preempted",
]

MAX_CHAIN: Final = 1000
"""Longest chain followed when runs are counted or shown (a bound on the reads)."""
CONTINUE_RETRY_S: Final = 60.0
"""Wait before a waiting continuation is tried again (no target was available, or
`reconcile` just sent it), in seconds."""


class OnPreempt(BaseModel):
    """What to do when a run is preempted: resume it on one of `targets` (an empty
    list: on its own target), at most `max_preemptions` times in its chain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    targets: tuple[TargetName, ...] = ()
    max_preemptions: Annotated[int, Field(ge=1, le=MAX_CHAIN)] = DEFAULT_MAX_PREEMPTIONS

    @field_validator("targets")
    @classmethod
    def _unique(cls, targets: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(targets)) != len(targets):
            raise ValueError("a target is named twice in the resume targets")
        return targets


class ContinuationPhase(StrEnum):
    """Where the continuation of a preempted run stands."""

    WAITING = "waiting"
    """Preempted: waiting for its checkpoint to be retrieved and verified."""
    LAUNCHED = "launched"
    """The next run of the chain was sent (its launch key is `continuation_key`)."""
    DECLINED = "declined"
    """Not continued, for the reason given (the chain's preemptions are used up, the
    checkpoint could not be retrieved, no target is available)."""


class Continuation(BaseModel):
    """The continuation of a preempted run, as recorded on it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: ContinuationPhase = ContinuationPhase.WAITING
    preemptions: Annotated[int, Field(ge=1)] = 1
    """Preemptions of the chain up to and including this run."""
    target: TargetName | None = None
    """Where the next run was sent (launched)."""
    key: str | None = None
    """The launch key of the next run (launched): the store maps it to the run."""
    reason: str | None = None
    """Why it was declined, or what happened while waiting (a target found gone)."""
    at: datetime | None = None
    """When the phase was last changed."""

    @field_validator("at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def is_preempted(snapshot: Snapshot | None) -> bool:
    """Whether a run that ended with `snapshot` was preempted: it saved for reason
    `preempted`. A run without a snapshot has no checkpoint to continue from, so it
    never counts, whatever ended it."""
    return snapshot is not None and snapshot.reason is SnapshotReason.PREEMPTED


def candidate_targets(plan: OnPreempt, preempted_on: str) -> list[str]:
    """The targets to try, in order, for the next run of a chain whose last run was
    preempted on `preempted_on` (see the module docstring)."""
    listed = list(plan.targets) or [preempted_on]
    return [t for t in listed if t != preempted_on] + [t for t in listed if t == preempted_on]


def continuation_key(run_id: str) -> str:
    """The launch key of the run that continues `run_id`: one per preempted run, so
    the continuation is launched once however often it is sent."""
    return f"continue.{run_id}"
