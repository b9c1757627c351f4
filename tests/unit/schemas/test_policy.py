"""`schemas.policy`: the time policies (deadline and cost) and the disk policy's
samples and verdict."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from schemas import RunLimits, RunState, SnapshotReason
from schemas.policy import (
    DiskSample,
    cost_request_after_s,
    deadline_request_after_s,
    disk_verdict,
    time_verdict,
)

from ..conftest import T0, record

# --- time policies ----------------------------------------------------------------


def test_the_deadline_is_asked_the_lead_before_max_hours() -> None:
    run = record(limits=RunLimits(max_hours=2))
    lead = 15 * 60
    assert deadline_request_after_s(run.limits, lead) == 2 * 3600 - lead
    just_before = T0 + timedelta(hours=2, minutes=-15, seconds=-1)
    assert time_verdict(run, just_before, lead_s=lead, cost_fraction=0.95) is None
    verdict = time_verdict(run, just_before + timedelta(seconds=1), lead_s=lead, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.DEADLINE


def test_a_budget_shorter_than_the_lead_is_asked_at_once() -> None:
    run = record(limits=RunLimits(max_hours=0.1))
    assert deadline_request_after_s(run.limits, 900) == 0
    verdict = time_verdict(run, T0, lead_s=900, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.DEADLINE


def test_the_cost_is_asked_at_95_percent_of_the_cap() -> None:
    run = record(limits=RunLimits(max_cost_usd=100, usd_per_hour=10))
    after = cost_request_after_s(run.limits, 0.95)
    assert after == pytest.approx(9.5 * 3600)
    assert time_verdict(run, T0 + timedelta(hours=9.49), lead_s=900, cost_fraction=0.95) is None
    verdict = time_verdict(run, T0 + timedelta(hours=9.5), lead_s=900, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.COST
    assert "95%" in verdict.why
    assert "100 USD" in verdict.why


def test_when_both_passed_the_earlier_one_is_the_reason() -> None:
    # cost at 95 % comes after 0.95 h; the deadline (1 h - 15 min) after 0.75 h.
    run = record(limits=RunLimits(max_hours=1, max_cost_usd=1, usd_per_hour=1))
    verdict = time_verdict(run, T0 + timedelta(hours=2), lead_s=900, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.DEADLINE
    run = record(limits=RunLimits(max_hours=10, max_cost_usd=1, usd_per_hour=1))
    verdict = time_verdict(run, T0 + timedelta(hours=20), lead_s=900, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.COST


def test_the_clock_starts_when_the_run_started_not_when_it_was_created() -> None:
    run = record(limits=RunLimits(max_hours=1), created=T0 - timedelta(hours=5))
    assert time_verdict(run, T0 + timedelta(minutes=40), lead_s=900, cost_fraction=0.95) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"state": RunState.STOPPED},
        {"state": RunState.PREPARING},
        {"snapshots": False},
        {"limits": RunLimits()},
    ],
)
def test_runs_that_cannot_be_asked_get_no_verdict(changes: dict[str, Any]) -> None:
    base: dict[str, Any] = {"limits": RunLimits(max_hours=0.01)}
    base.update(changes)
    run = record(**base)
    assert time_verdict(run, T0 + timedelta(days=1), lead_s=0, cost_fraction=0.95) is None


# --- disk samples -----------------------------------------------------------------


KIB = 1024
MIB = 1024 * KIB


def test_a_sample_is_frozen() -> None:
    sample = DiskSample(10, 5, 5, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.used_bytes = 1  # type: ignore[misc]


def test_used_fraction_is_df_s() -> None:
    # Blocks reserved for root are neither used nor available: df's Use% leaves them
    # out, and so does the sample.
    assert DiskSample(1000, 460, 40, None).used_fraction == 0.92
    assert DiskSample(100, 0, 0, None).used_fraction == 1.0
    assert DiskSample(0, 0, 0, None).used_fraction == 0.0


# --- disk verdict -----------------------------------------------------------------


def test_the_used_rule_flips_at_92_percent() -> None:
    assert disk_verdict(DiskSample(10_000, 9_199, 801, None)) is None
    assert disk_verdict(DiskSample(10_000, 9_200, 800, None)) == (
        "the run directory's filesystem is 92 % used"
    )
    assert disk_verdict(DiskSample(10_000, 9_201, 799, None)) == (
        "the run directory's filesystem is 93 % used"  # rounded up, as df shows it
    )
    assert disk_verdict(DiskSample(10_000, 9_000, 1_000, None), used_limit=0.9) is not None
    assert disk_verdict(DiskSample(10_000, 9_000, 1_000, None), used_limit=0.95) is None


def test_the_checkpoint_rule_flips_at_one_and_a_half_times() -> None:
    checkpoint = 300 * MIB
    assert disk_verdict(DiskSample(100_000 * MIB, 1 * MIB, 450 * MIB, checkpoint)) is None
    assert disk_verdict(DiskSample(100_000 * MIB, 1 * MIB, 450 * MIB - 1, checkpoint)) == (
        "450 MiB free, below 1.5x the newest checkpoint (300 MiB)"
    )
    assert disk_verdict(DiskSample(10**12, 1, 412 * MIB, checkpoint)) == (
        "412 MiB free, below 1.5x the newest checkpoint (300 MiB)"
    )
    assert disk_verdict(DiskSample(10**12, 1, 3 * MIB, 5 * MIB, ), checkpoint_factor=2) == (
        "3.0 MiB free, below 2x the newest checkpoint (5.0 MiB)"
    )  # fmt: skip
    # Without a checkpoint, or with the rule off, only the used rule counts.
    assert disk_verdict(DiskSample(10**12, 1, 1, None)) is None
    assert disk_verdict(DiskSample(10**12, 1, 1, 10**9), checkpoint_factor=0) is None


def test_the_used_rule_comes_first() -> None:
    why = disk_verdict(DiskSample(1000 * MIB, 990 * MIB, 10 * MIB, 100 * MIB))
    assert why == "the run directory's filesystem is 99 % used"


@pytest.mark.parametrize(
    ("used_limit", "factor"),
    [(0, 1.5), (1.01, 1.5), (float("nan"), 1.5), (0.9, -1), (0.9, float("inf"))],
)
def test_bad_limits_are_refused(used_limit: float, factor: float) -> None:
    with pytest.raises(ValueError, match=r"used_limit|checkpoint_factor"):
        disk_verdict(DiskSample(1, 1, 1, 1), used_limit, factor)


# --- the saves' lead ------------------------------------------------------------------


def test_the_deadline_is_asked_the_saves_lead_before_when_it_is_longer() -> None:
    run = record(limits=RunLimits(max_hours=2))
    lead, saves = 15 * 60, 40 * 60.0  # 3 x a save of 13 min 20 s
    assert deadline_request_after_s(run.limits, lead, saves) == 2 * 3600 - saves
    assert deadline_request_after_s(run.limits, lead, 60.0) == 2 * 3600 - lead  # shorter
    at = T0 + timedelta(hours=2) - timedelta(seconds=saves)
    assert time_verdict(run, at - timedelta(seconds=1), lead_s=lead, cost_fraction=0.95,
                        save_lead_s=saves) is None  # fmt: skip
    verdict = time_verdict(run, at, lead_s=lead, cost_fraction=0.95, save_lead_s=saves)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.DEADLINE
    assert "40.0 min away or past (its saves' lead)" in verdict.why
    # Without the saves' lead, the same moment asks nothing yet.
    assert time_verdict(run, at, lead_s=lead, cost_fraction=0.95) is None


def test_the_cost_is_asked_the_saves_lead_before_the_cap_is_spent() -> None:
    run = record(limits=RunLimits(max_cost_usd=10, usd_per_hour=10))  # the cap: 1 h
    assert cost_request_after_s(run.limits, 0.95) == pytest.approx(0.95 * 3600)
    saves = 600.0  # more than the last 5 % (180 s)
    assert cost_request_after_s(run.limits, 0.95, saves) == pytest.approx(3600 - saves)
    assert cost_request_after_s(run.limits, 0.95, 60.0) == pytest.approx(0.95 * 3600)
    assert cost_request_after_s(run.limits, 0.95, 7200.0) == 0  # asked at once
    at = T0 + timedelta(seconds=3600 - saves)
    assert time_verdict(run, at - timedelta(seconds=1), lead_s=900, cost_fraction=0.95,
                        save_lead_s=saves) is None  # fmt: skip
    verdict = time_verdict(run, at, lead_s=900, cost_fraction=0.95, save_lead_s=saves)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.COST
    assert verdict.why == (
        "cost 8.33 USD of the cap 10 USD: the rest lasts less than its saves need (10.0 min)"
    )
    assert time_verdict(run, at, lead_s=900, cost_fraction=0.95) is None
