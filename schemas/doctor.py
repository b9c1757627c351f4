"""What `runwarden doctor TARGET` answers (the `runwarden.doctor` task's result): for
each thing runwarden needs on a target, whether it is there, what was found, and what
does not work without it; and the target's clock against the worker's.

Status of a check:

- `ok`: there, and working as the scripts use it (or not used by this target's
  executor at all, which `found` then says);
- `warn`: runwarden works, but something is slower, weaker or unavailable (the
  preemption notice watcher, pid reuse detection, a skewed clock...): `breaks` says
  what;
- `missing`: something runwarden needs is absent or does not work: some operation
  on this target fails (`breaks` says which). `runwarden doctor` exits 1.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from .targets import TargetName

__all__ = [
    "CLOCK_SKEW_WARN_S",
    "CheckStatus",
    "ClockSkew",
    "DoctorCheck",
    "DoctorReport",
    "clock_skew",
    "tightest",
]

CLOCK_SKEW_WARN_S: Final = 2.0
"""A target clock that may be further than this from the worker's, in seconds, is a
warning. Times a target writes (a proof's and a notice's time, metrics) are read
against the worker's clock, and the worker's deadlines (`max_hours`, the proof and
end timeouts) against the job's progress; a host kept in time (NTP) is within
milliseconds, one that is not drifts by seconds a day."""

CheckStatus = Literal["ok", "warn", "missing"]

_Text = Annotated[str, Field(max_length=500)]


class DoctorCheck(BaseModel):
    """One thing a target needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")]
    """What is checked: `sh`, `setsid`, `tar`, `clock`..."""
    status: CheckStatus
    found: _Text
    """What the probe found, for a person: a version, a path, `absent`..."""
    breaks: _Text
    """What does not work without it: for a check that is not `ok`, what fails or
    degrades on this target now."""


class ClockSkew(BaseModel):
    """The target's clock minus the worker's, from the tightest of a few samples."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    skew_s: float = Field(allow_inf_nan=False)
    """Seconds the target is ahead of the worker (negative: behind), the middle of
    the interval the samples allow."""
    uncertainty_s: float = Field(ge=0, allow_inf_nan=False)
    """Half the width of that interval, in seconds: the skew is within
    `skew_s ± uncertainty_s`."""

    @property
    def worst_s(self) -> float:
        """The largest skew the sample allows, in absolute seconds."""
        return abs(self.skew_s) + self.uncertainty_s


def clock_skew(
    before_s: float, target_s: float, resolution_s: float, after_s: float
) -> ClockSkew:
    """The skew of one sample: the worker read its clock (`before_s`), the target
    read its own (`target_s`, truncated to `resolution_s`), the worker read its clock
    again (`after_s`), all in Unix seconds. The target's reading happened at some
    instant between the worker's two, and its true time was in `[target_s, target_s
    + resolution_s)`, so the skew is in `(target_s - after_s, target_s +
    resolution_s - before_s)`.

    Raises:
        ValueError: for a value that is not finite, a negative resolution, or
            `after_s` before `before_s`.
    """
    values = (before_s, target_s, resolution_s, after_s)
    if not all(math.isfinite(v) for v in values) or resolution_s < 0 or after_s < before_s:
        raise ValueError("a clock sample needs finite times, in order")
    low = target_s - after_s
    high = target_s + resolution_s - before_s
    return ClockSkew(skew_s=(low + high) / 2, uncertainty_s=(high - low) / 2)


def tightest(samples: list[ClockSkew]) -> ClockSkew | None:
    """The sample with the least uncertainty (None for none)."""
    return min(samples, key=lambda s: s.uncertainty_s, default=None)


class DoctorReport(BaseModel):
    """The doctor's answer for one target, as the worker that ran it sees the target."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: TargetName
    kind: Literal["local", "ssh"]
    workdir: str
    run_as: str | None = None
    worker: Annotated[str, Field(max_length=300)]
    """The worker that ran the probe (`<host>:<pid>`): its SSH keys, sudo rules and
    clock are the ones checked."""
    checked_at: datetime
    checks: tuple[DoctorCheck, ...]
    clock: ClockSkew | None = None
    """The target's clock against the worker's; None when it could not be read."""

    @property
    def missing(self) -> tuple[DoctorCheck, ...]:
        """The checks whose status is `missing`."""
        return tuple(c for c in self.checks if c.status == "missing")

    @property
    def warnings(self) -> tuple[DoctorCheck, ...]:
        """The checks whose status is `warn`."""
        return tuple(c for c in self.checks if c.status == "warn")

    @property
    def exit_code(self) -> int:
        """1 when something runwarden needs is missing, else 0 (warnings or not)."""
        return 1 if self.missing else 0
