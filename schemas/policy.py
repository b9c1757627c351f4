"""The time policies (DESIGN.md §7): when a run's `max_hours` or its cost cap asks for
a snapshot. Pure functions over a run record and a clock, shared by the workers'
policy tick and the watchdog's timing at launch; no I/O. The disk policy needs a
probe of the target and lives with the executors (`workers.executors.probe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .run import RunLimits, RunRecord, RunState
from .snapshot import SnapshotReason

__all__ = [
    "PolicyVerdict",
    "cost_request_after_s",
    "deadline_request_after_s",
    "time_verdict",
]


@dataclass(frozen=True)
class PolicyVerdict:
    """A policy asks for a snapshot: its reason, and why, for a person."""

    reason: SnapshotReason
    why: str


def deadline_request_after_s(limits: RunLimits, lead_s: float) -> float | None:
    """Seconds after a run's start at which its `deadline` snapshot is asked:
    `max_hours` minus `lead_s`, never below 0 (a budget shorter than the lead is
    asked at once). None when the run has no `max_hours`."""
    if limits.max_hours is None:
        return None
    return max(0.0, limits.max_hours * 3600.0 - lead_s)


def cost_request_after_s(limits: RunLimits, fraction: float) -> float | None:
    """Seconds after a run's start at which its cost reaches `fraction` of
    `max_cost_usd` at `usd_per_hour`. None without a cost cap."""
    if limits.max_cost_usd is None or limits.usd_per_hour is None:
        return None
    return fraction * limits.max_cost_usd / limits.usd_per_hour * 3600.0


def time_verdict(
    run: RunRecord, now: datetime, *, lead_s: float, cost_fraction: float
) -> PolicyVerdict | None:
    """The time policy that asks `run` for a snapshot at `now`, or None.

    A run's hours count from `started` (from `created` for a record without it).
    When both the deadline and the cost threshold have passed, the one that passed
    first is the reason (a stop keeps its first reason). Only a running run that
    reads snapshot requests is ever asked.
    """
    if run.state is not RunState.RUNNING or not run.snapshots:
        return None
    start = run.started or run.created
    found: list[tuple[float, PolicyVerdict]] = []
    after = deadline_request_after_s(run.limits, lead_s)
    if after is not None and now >= start + timedelta(seconds=after):
        assert run.limits.max_hours is not None
        found.append(
            (
                after,
                PolicyVerdict(
                    SnapshotReason.DEADLINE,
                    f"max_hours {run.limits.max_hours:g} h: "
                    f"its deadline is {lead_s / 60:g} min away or past",
                ),
            )
        )
    after = cost_request_after_s(run.limits, cost_fraction)
    if after is not None and now >= start + timedelta(seconds=after):
        assert run.limits.usd_per_hour is not None
        spent = (now - start).total_seconds() / 3600.0 * run.limits.usd_per_hour
        found.append(
            (
                after,
                PolicyVerdict(
                    SnapshotReason.COST,
                    f"cost {spent:.2f} USD reached {cost_fraction:.0%} of the cap "
                    f"{run.limits.max_cost_usd:g} USD",
                ),
            )
        )
    if not found:
        return None
    return min(found, key=lambda item: item[0])[1]
