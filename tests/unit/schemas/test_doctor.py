"""`schemas.doctor`: the clock skew of a sample (the interval always holds the true
skew), the tightest sample, and the report's verdict."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.doctor import ClockSkew, DoctorCheck, DoctorReport, clock_skew, tightest

T0 = 1_800_000_000.0


def test_a_sample_in_nanoseconds() -> None:
    skew = clock_skew(T0, T0 + 30.05, 1e-9, T0 + 0.1)
    assert skew.skew_s == pytest.approx(30.0, abs=1e-6)
    assert skew.uncertainty_s == pytest.approx(0.05, abs=1e-6)
    assert skew.worst_s == pytest.approx(30.05, abs=1e-6)


def test_a_sample_in_whole_seconds_is_half_a_second_wider() -> None:
    skew = clock_skew(T0, T0 - 5, 1.0, T0)
    assert skew.skew_s == pytest.approx(-4.5)
    assert skew.uncertainty_s == pytest.approx(0.5)


@given(
    true_skew=st.floats(-1e5, 1e5),
    before=st.floats(0, 1e9),
    delay=st.floats(0, 10),
    at=st.floats(0, 1),
    whole_seconds=st.booleans(),
)
def test_the_interval_holds_the_true_skew(
    true_skew: float, before: float, delay: float, at: float, whole_seconds: bool
) -> None:
    after = before + delay
    instant = before + at * delay  # when the target read its clock, by the worker's
    reading = instant + true_skew
    resolution = 1.0 if whole_seconds else 1e-9
    if whole_seconds:
        reading = math.floor(reading)
    skew = clock_skew(before, reading, resolution, after)
    slack = 1e-6 * max(1.0, abs(before), abs(reading))  # float rounding
    assert abs(skew.skew_s - true_skew) <= skew.uncertainty_s + slack


@pytest.mark.parametrize(
    "values",
    [
        (T0, T0, 1.0, T0 - 1),  # the second read before the first
        (T0, math.nan, 1.0, T0),
        (T0, math.inf, 1.0, T0),
        (T0, T0, -1.0, T0),
    ],
)
def test_a_sample_out_of_order_or_not_finite_is_refused(
    values: tuple[float, float, float, float],
) -> None:
    with pytest.raises(ValueError, match="clock sample"):
        clock_skew(*values)


def test_the_tightest_sample() -> None:
    wide = ClockSkew(skew_s=1.0, uncertainty_s=0.5)
    narrow = ClockSkew(skew_s=0.2, uncertainty_s=0.01)
    assert tightest([wide, narrow, wide]) == narrow
    assert tightest([]) is None


def check(name: str, status: str) -> DoctorCheck:
    return DoctorCheck.model_validate(
        {"name": name, "status": status, "found": "f", "breaks": "b"}
    )


def report(*checks: DoctorCheck) -> DoctorReport:
    return DoctorReport(
        target="gpu1",
        kind="ssh",
        workdir="/w",
        worker="host:1",
        checked_at=datetime(2026, 11, 30, tzinfo=UTC),
        checks=checks,
    )


def test_a_missing_check_fails_the_report() -> None:
    done = report(check("sh", "ok"), check("tar", "missing"), check("clock", "warn"))
    assert [c.name for c in done.missing] == ["tar"]
    assert [c.name for c in done.warnings] == ["clock"]
    assert done.exit_code == 1


def test_warnings_alone_pass() -> None:
    assert report(check("sh", "ok"), check("clock", "warn")).exit_code == 0
    assert report().exit_code == 0


def test_the_report_round_trips_as_json() -> None:
    done = report(check("sh", "ok")).model_copy(
        update={"clock": ClockSkew(skew_s=-0.5, uncertainty_s=0.25)}
    )
    assert DoctorReport.model_validate_json(done.model_dump_json()) == done


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "Sh"},
        {"name": "a b"},
        {"name": ""},
        {"status": "broken"},
        {"found": "x" * 501},
        {"breaks": "x" * 501},
        {"extra": 1},
    ],
)
def test_a_check_out_of_shape_is_refused(fields: dict[str, object]) -> None:
    base = {"name": "sh", "status": "ok", "found": "", "breaks": ""}
    with pytest.raises(ValidationError):
        DoctorCheck.model_validate({**base, **fields})


@pytest.mark.parametrize(
    "fields", [{"skew_s": math.nan}, {"uncertainty_s": -1.0}, {"uncertainty_s": math.inf}]
)
def test_a_clock_skew_out_of_shape_is_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        ClockSkew.model_validate({"skew_s": 0.0, "uncertainty_s": 0.0, **fields})
