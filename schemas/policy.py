"""The policies (docs/architecture.md, "Policies"): when a run's `max_hours`, its cost
cap or its target's disk asks for a snapshot. Pure functions over a run record, a
clock and a disk sample, shared by the workers' policy tick and the watchdog's timing
at launch; no I/O (the disk sample comes from an executor's read-only probe). The
defaults here are the settings' defaults (`schemas.settings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from .run import RunLimits, RunRecord, RunState
from .snapshot import SnapshotReason
from .text import format_bytes

__all__ = [
    "COST_FRACTION",
    "DEADLINE_LEAD_S",
    "DISK_CHECKPOINT_FACTOR",
    "DISK_USED_LIMIT",
    "DiskSample",
    "PolicyVerdict",
    "cost_request_after_s",
    "deadline_request_after_s",
    "disk_verdict",
    "time_verdict",
]


DEADLINE_LEAD_S: Final = 15 * 60.0
"""How long before a run's `max_hours` its `deadline` snapshot is asked, in seconds."""
COST_FRACTION: Final = 0.95
"""Share of `max_cost_usd` at which the `cost` snapshot is asked."""
DISK_USED_LIMIT: Final = 0.92
"""Used share of the run directory's filesystem at which `disk` is asked."""
DISK_CHECKPOINT_FACTOR: Final = 1.5
"""`disk` is asked when free space is below this many times the newest checkpoint."""


@dataclass(frozen=True)
class PolicyVerdict:
    """A policy asks for a snapshot: its reason, and why, for a person."""

    reason: SnapshotReason
    why: str


def deadline_request_after_s(
    limits: RunLimits, lead_s: float, save_lead_s: float = 0.0
) -> float | None:
    """Seconds after a run's start at which its `deadline` snapshot is asked:
    `max_hours` minus the larger of `lead_s` and `save_lead_s` (what the run's saves
    need, `schemas.budget.save_lead_s`), never below 0 (a budget shorter than the
    lead is asked at once). None when the run has no `max_hours`."""
    if limits.max_hours is None:
        return None
    return max(0.0, limits.max_hours * 3600.0 - max(lead_s, save_lead_s))


def cost_request_after_s(
    limits: RunLimits, fraction: float, save_lead_s: float = 0.0
) -> float | None:
    """Seconds after a run's start at which its `cost` snapshot is asked: when its
    cost reaches `fraction` of `max_cost_usd` at `usd_per_hour`, or `save_lead_s`
    (what the run's saves need, `schemas.budget.save_lead_s`) before the whole cap
    is spent, whichever comes first, never below 0. None without a cost cap."""
    if limits.max_cost_usd is None or limits.usd_per_hour is None:
        return None
    spent_s = limits.max_cost_usd / limits.usd_per_hour * 3600.0
    return max(0.0, min(fraction * spent_s, spent_s - save_lead_s))


def time_verdict(
    run: RunRecord,
    now: datetime,
    *,
    lead_s: float,
    cost_fraction: float,
    save_lead_s: float = 0.0,
) -> PolicyVerdict | None:
    """The time policy that asks `run` for a snapshot at `now`, or None.

    A run's hours count from `started` (from `created` for a record without it).
    `save_lead_s` is what the run's saves need (`schemas.budget.save_lead_s`): the
    deadline is asked at least that long before `max_hours`, and the cost at least
    that long before the cap is spent. When both the deadline and the cost threshold
    have passed, the one that passed first is the reason (a stop keeps its first
    reason). Only a running run that reads snapshot requests is ever asked.
    """
    if run.state is not RunState.RUNNING or not run.snapshots:
        return None
    start = run.started or run.created
    found: list[tuple[float, PolicyVerdict]] = []
    after = deadline_request_after_s(run.limits, lead_s, save_lead_s)
    if after is not None and now >= start + timedelta(seconds=after):
        assert run.limits.max_hours is not None
        why = f"max_hours {run.limits.max_hours:g} h: "
        if save_lead_s > lead_s:
            why += f"its deadline is {save_lead_s / 60:.1f} min away or past (its saves' lead)"
        else:
            why += f"its deadline is {lead_s / 60:g} min away or past"
        found.append((after, PolicyVerdict(SnapshotReason.DEADLINE, why)))
    after = cost_request_after_s(run.limits, cost_fraction, save_lead_s)
    if after is not None and now >= start + timedelta(seconds=after):
        assert run.limits.usd_per_hour is not None
        assert run.limits.max_cost_usd is not None
        spent = (now - start).total_seconds() / 3600.0 * run.limits.usd_per_hour
        cap = run.limits.max_cost_usd
        if spent >= cost_fraction * cap:
            why = f"cost {spent:.2f} USD reached {cost_fraction:.0%} of the cap {cap:g} USD"
        else:
            why = (
                f"cost {spent:.2f} USD of the cap {cap:g} USD: the rest lasts less than "
                f"its saves need ({save_lead_s / 60:.1f} min)"
            )
        found.append((after, PolicyVerdict(SnapshotReason.COST, why)))
    if not found:
        return None
    return min(found, key=lambda item: item[0])[1]


@dataclass(frozen=True)
class DiskSample:
    """The filesystem of one run directory, as `df -Pk` reports it, and the newest
    checkpoint's disk usage (`du -sk`), all in bytes (KiB * 1024)."""

    size_bytes: int
    used_bytes: int
    avail_bytes: int
    """Free space an unprivileged writer can use (df's "Available")."""
    checkpoint_bytes: int | None
    """Disk usage of the newest `output/checkpoint-<N>` (highest N), or None when there
    is none (or it could not be measured)."""

    @property
    def used_fraction(self) -> float:
        """The used share as df's Use% computes it: used / (used + available), so the
        blocks reserved for root count as neither (before df rounds it up to a whole
        percent). A filesystem with neither used nor available blocks is full when
        it has a size, else empty (df shows `-`)."""
        total = self.used_bytes + self.avail_bytes
        if total <= 0:
            return 1.0 if self.size_bytes > 0 else 0.0
        return self.used_bytes / total


def disk_verdict(
    sample: DiskSample,
    used_limit: float = DISK_USED_LIMIT,
    checkpoint_factor: float = DISK_CHECKPOINT_FACTOR,
) -> str | None:
    """Why the disk policy asks for a snapshot on `sample`, for a person, or None:

    - the filesystem is at least `used_limit` used ([`DiskSample.used_fraction`]):
      "the run directory's filesystem is 93 % used" (rounded up, as df shows it);
    - else, with a newest checkpoint, free space is below `checkpoint_factor` times
      its size: "412 MiB free, below 1.5x the newest checkpoint (300 MiB)".

    Raises:
        ValueError: when `used_limit` is not in (0, 1] or `checkpoint_factor` is not
            a finite number at least 0.
    """
    if not 0 < used_limit <= 1:
        raise ValueError(f"used_limit {used_limit!r} is not in (0, 1]")
    if not math.isfinite(checkpoint_factor) or checkpoint_factor < 0:
        raise ValueError(f"checkpoint_factor {checkpoint_factor!r} is not a finite number >= 0")
    fraction = sample.used_fraction
    if fraction >= used_limit:
        return f"the run directory's filesystem is {math.ceil(fraction * 100 - 1e-9)} % used"
    checkpoint = sample.checkpoint_bytes
    if checkpoint is not None and sample.avail_bytes < checkpoint_factor * checkpoint:
        return (
            f"{format_bytes(sample.avail_bytes)} free, below {checkpoint_factor:g}x "
            f"the newest checkpoint ({format_bytes(checkpoint)})"
        )
    return None
