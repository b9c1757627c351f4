"""Stop budgets: how long a run's stop waits for the job's proof, and for its end,
learned from how long the run's saves took (docs/architecture.md, "Stops").

A run may be launched with its own timeouts ([`StopTimeouts`], `runwarden launch
--proof-timeout S --end-timeout S`). Without one, the proof timeout of each of its
stops is learned from its save samples ([`SaveSample`]): the request-to-proof time
of its earlier stops, measured by the workers, and the periodic saves its job
reports in its metrics (`save` lines, [`save_samples`]). [`stop_budget`] is the
rule; [`save_lead_s`] is how early the policies must ask. Pure: no I/O, no clock;
imports nothing of ours (`stops` and `run` import it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "MAX_TIMEOUT_S",
    "PROOF_TIMEOUT_CEILING_S",
    "PROOF_TIMEOUT_FACTOR",
    "PROOF_TIMEOUT_FLOOR_S",
    "PROOF_TIMEOUT_MARGIN_S",
    "SAVE_EVENT",
    "BudgetRule",
    "SaveKind",
    "SaveSample",
    "StopBudget",
    "StopTimeouts",
    "TimeoutSource",
    "save_lead_s",
    "save_samples",
    "stop_budget",
]

MAX_TIMEOUT_S: Final = 30 * 24 * 3600.0
"""The longest timeout a run may be launched with, and the longest save a sample may
report, in seconds (30 days)."""
PROOF_TIMEOUT_FACTOR: Final = 3.0
"""A learned proof timeout is this many times the longest save seen (plus the margin)."""
PROOF_TIMEOUT_MARGIN_S: Final = 30.0
"""Seconds added to the multiple of the longest save."""
PROOF_TIMEOUT_FLOOR_S: Final = 60.0
"""A learned proof timeout is never shorter, in seconds."""
PROOF_TIMEOUT_CEILING_S: Final = 7200.0
"""A learned proof timeout is never longer, in seconds."""
SAVE_EVENT: Final = "save"
"""The `event` of a metrics line that reports one periodic save of the job:
`{"event": "save", "time": T, "step": S, "seconds": D, "step_seconds": E}`
(docs/protocol.md, "Metrics")."""

_Timeout = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)]


def _shown(seconds: float) -> str:
    """`seconds` for people: to a tenth, without trailing zeros (`7.3`, `1800`)."""
    return f"{round(seconds, 1):g}"


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class StopTimeouts(BaseModel):
    """The timeouts a run was launched with; each is optional. Given, a timeout is
    used by every stop of the run, whatever was learned or configured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proof_timeout_s: _Timeout | None = None
    """Seconds from a snapshot request to the proof before the job is cancelled."""
    end_timeout_s: _Timeout | None = None
    """Seconds from the proof to the job's end before the job is cancelled."""


class TimeoutSource(StrEnum):
    """Where a stop's proof timeout came from."""

    EXPLICIT = "explicit"
    """The run's own (`--proof-timeout`)."""
    LEARNED = "learned"
    """Derived from the run's save samples ([`stop_budget`])."""
    DEFAULT = "default"
    """The configured one (`RUNWARDEN_PROOF_TIMEOUT_S`): nothing was learned."""


SaveKind = Literal["stop", "save"]
"""`stop`: a stop's request-to-proof time, measured by a worker. `save`: a periodic
save the job reported in its metrics (its seconds plus one step's)."""


class SaveSample(BaseModel):
    """How long one save of a run took, as it is stored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SaveKind
    seconds: Annotated[float, Field(ge=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)]
    at: Annotated[datetime, AfterValidator(_utc)]
    """When a worker recorded it."""


class StopBudget(BaseModel):
    """The timeouts one stop got, and why, as the stop keeps them (shown by `show`,
    `stops` and the stop history)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proof_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    end_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    source: TimeoutSource
    """Where the proof timeout came from (the end timeout is the run's or the
    configured one)."""
    why: Annotated[str, Field(max_length=300)]
    """The rule as applied, for people: "3 x 2.4 s (the longest of 2 saves) + 1 s"."""

    def describe(self) -> str:
        """One short phrase for people: `proof timeout 8.2 s (learned)`."""
        return f"proof timeout {_shown(self.proof_timeout_s)} s ({self.source})"


@dataclass(frozen=True)
class BudgetRule:
    """The knobs of [`stop_budget`] (from the settings, `RUNWARDEN_*`), in seconds."""

    default_proof_s: float
    """`RUNWARDEN_PROOF_TIMEOUT_S`: the proof timeout when nothing was learned."""
    default_end_s: float
    """`RUNWARDEN_END_TIMEOUT_S`."""
    factor: float
    """`RUNWARDEN_PROOF_TIMEOUT_FACTOR`: how many times the longest save."""
    margin_s: float
    """`RUNWARDEN_PROOF_TIMEOUT_MARGIN_S`: added to the multiple."""
    floor_s: float
    """`RUNWARDEN_PROOF_TIMEOUT_FLOOR_S`: a learned timeout is never shorter."""
    ceiling_s: float
    """`RUNWARDEN_PROOF_TIMEOUT_CEILING_S`: a learned timeout is never longer."""

    def __post_init__(self) -> None:
        values = (self.default_proof_s, self.default_end_s, self.floor_s, self.ceiling_s)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError("the default timeouts, the floor and the ceiling are positive")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"the factor {self.factor!r} is not a finite number >= 1")
        if not (math.isfinite(self.margin_s) and self.margin_s >= 0):
            raise ValueError(f"the margin {self.margin_s!r} is not a finite number >= 0")
        if self.floor_s > self.ceiling_s:
            raise ValueError(
                f"the floor {self.floor_s:g} s is above the ceiling {self.ceiling_s:g} s"
            )


def stop_budget(
    timeouts: StopTimeouts, samples: Sequence[SaveSample], rule: BudgetRule
) -> StopBudget:
    """The timeouts of a run's next stop.

    Proof timeout, the first that applies:

    1. **explicit**: the run's own `timeouts.proof_timeout_s`;
    2. **learned**, with at least one sample: `rule.factor` times the longest of
       `samples`, plus `rule.margin_s`, clamped to `[rule.floor_s, rule.ceiling_s]`.
       The longest, not a mean: one slow save (a full disk, a cold cache) is what the
       next one may take again;
    3. **default**: `rule.default_proof_s`.

    End timeout: the run's own `timeouts.end_timeout_s`, else `rule.default_end_s`
    (a job's exit after its proof is not learned).
    """
    end = timeouts.end_timeout_s or rule.default_end_s
    if timeouts.proof_timeout_s is not None:
        return StopBudget(
            proof_timeout_s=timeouts.proof_timeout_s,
            end_timeout_s=end,
            source=TimeoutSource.EXPLICIT,
            why=f"the run's own, {_shown(timeouts.proof_timeout_s)} s (--proof-timeout)",
        )
    if not samples:
        return StopBudget(
            proof_timeout_s=rule.default_proof_s,
            end_timeout_s=end,
            source=TimeoutSource.DEFAULT,
            why=f"no save seen yet: the configured {_shown(rule.default_proof_s)} s",
        )
    longest = max(s.seconds for s in samples)
    raw = rule.factor * longest + rule.margin_s
    proof = min(rule.ceiling_s, max(rule.floor_s, raw))
    why = (
        f"{rule.factor:g} x {_shown(longest)} s (the longest of {len(samples)} "
        f"save{'s' if len(samples) != 1 else ''}) + {_shown(rule.margin_s)} s"
    )
    if raw < rule.floor_s:
        why += f", raised to the floor {_shown(proof)} s"
    elif raw > rule.ceiling_s:
        why += f", cut to the ceiling {_shown(proof)} s"
    return StopBudget(
        proof_timeout_s=proof, end_timeout_s=end, source=TimeoutSource.LEARNED, why=why
    )


def save_lead_s(samples: Sequence[SaveSample], factor: float) -> float:
    """How long before a run's deadline (or the end of its cost budget) a policy must
    ask at the latest, so that its save can finish: `factor` times the longest of
    `samples`, in seconds; 0 without samples."""
    if not samples:
        return 0.0
    return factor * max(s.seconds for s in samples)


def _seconds(value: Any) -> float | None:
    """`value` when it is a finite number of seconds in `[0, MAX_TIMEOUT_S]` (a
    `bool` is not), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and 0 <= number <= MAX_TIMEOUT_S else None


def save_samples(records: Sequence[Mapping[str, Any]], at: datetime) -> list[SaveSample]:
    """The periodic saves that metrics `records` (in order) report, as samples recorded
    `at`, in the same order: one for each `save` line whose `seconds` is a finite
    number in `[0, MAX_TIMEOUT_S]`. A line's `step_seconds`, when it is one too, is
    added: a request is read at the end of a step, so a stop waits for up to one step
    before its save begins. The sum is capped at `MAX_TIMEOUT_S`. Anything else is
    ignored, never an error: the records come from the job."""
    found: list[SaveSample] = []
    for record in records:
        if record.get("event") != SAVE_EVENT:
            continue
        seconds = _seconds(record.get("seconds"))
        if seconds is None:
            continue
        step = _seconds(record.get("step_seconds")) or 0.0
        total = min(MAX_TIMEOUT_S, seconds + step)
        found.append(SaveSample(kind="save", seconds=total, at=at))
    return found
