"""`schemas.budget`: the timeouts of a run's next stop (explicit, learned, default),
the policies' lead from the saves, and the `save` lines of the metrics."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import Settings, StopPhase, StopState
from schemas.budget import (
    MAX_TIMEOUT_S,
    BudgetRule,
    SaveSample,
    StopBudget,
    StopTimeouts,
    TimeoutSource,
    save_lead_s,
    save_samples,
    stop_budget,
)
from schemas.events import LaunchSpec

from ..conftest import T0, record

RULE = BudgetRule(
    default_proof_s=1800, default_end_s=600, factor=3, margin_s=30, floor_s=60, ceiling_s=7200
)


def samples(*seconds: float, kind: Any = "stop") -> list[SaveSample]:
    return [SaveSample(kind=kind, seconds=s, at=T0) for s in seconds]


# --- the rule ---------------------------------------------------------------------


def test_nothing_learned_is_the_configured_default() -> None:
    budget = stop_budget(StopTimeouts(), [], RULE)
    assert (budget.proof_timeout_s, budget.end_timeout_s) == (1800, 600)
    assert budget.source is TimeoutSource.DEFAULT
    assert "no save seen yet" in budget.why


def test_learned_is_the_factor_times_the_longest_save_plus_the_margin() -> None:
    budget = stop_budget(StopTimeouts(), samples(20, 45.5, 31), RULE)
    assert budget.source is TimeoutSource.LEARNED
    assert budget.proof_timeout_s == pytest.approx(3 * 45.5 + 30)
    assert budget.end_timeout_s == 600  # the end timeout is never learned
    assert budget.why == "3 x 45.5 s (the longest of 3 saves) + 30 s"
    assert budget.describe() == "proof timeout 166.5 s (learned)"


def test_a_20_second_save_gets_minutes_not_half_an_hour() -> None:
    budget = stop_budget(StopTimeouts(), samples(20), RULE)
    assert budget.proof_timeout_s == 90
    assert budget.proof_timeout_s < RULE.default_proof_s / 10


def test_a_learned_timeout_is_raised_to_the_floor() -> None:
    budget = stop_budget(StopTimeouts(), samples(2), RULE)
    assert budget.proof_timeout_s == 60
    assert budget.why.endswith(", raised to the floor 60 s")


def test_a_40_minute_save_gets_more_than_the_default_up_to_the_ceiling() -> None:
    budget = stop_budget(StopTimeouts(), samples(40 * 60), RULE)
    assert budget.proof_timeout_s == 7200 > RULE.default_proof_s
    assert budget.why.endswith(", cut to the ceiling 7200 s")
    shorter = stop_budget(StopTimeouts(), samples(15 * 60), RULE)
    assert shorter.proof_timeout_s == 3 * 900 + 30 > RULE.default_proof_s


def test_the_longest_save_counts_not_the_mean() -> None:
    many = stop_budget(StopTimeouts(), samples(*([1.0] * 19), 100.0), RULE)
    assert many.proof_timeout_s == 330


def test_the_runs_own_timeouts_win_over_learned_and_default() -> None:
    own = StopTimeouts(proof_timeout_s=5, end_timeout_s=7)
    for learned in ([], samples(1000)):
        budget = stop_budget(own, learned, RULE)
        assert (budget.proof_timeout_s, budget.end_timeout_s) == (5, 7)
        assert budget.source is TimeoutSource.EXPLICIT
    # An explicit proof timeout below the floor stays: the floor bounds learning only.
    assert stop_budget(StopTimeouts(proof_timeout_s=1), samples(10), RULE).proof_timeout_s == 1
    # Only the end timeout given: the proof timeout is still learned.
    budget = stop_budget(StopTimeouts(end_timeout_s=9), samples(20), RULE)
    assert (budget.source, budget.proof_timeout_s, budget.end_timeout_s) == ("learned", 90, 9)


@pytest.mark.parametrize(
    "knobs",
    [
        {"factor": 0.5},
        {"factor": math.inf},
        {"margin_s": -1},
        {"floor_s": 0},
        {"ceiling_s": math.nan},
        {"floor_s": 100, "ceiling_s": 50},
        {"default_proof_s": -1},
    ],
)
def test_a_bad_rule_is_refused(knobs: dict[str, float]) -> None:
    base: dict[str, float] = {
        "default_proof_s": 1800, "default_end_s": 600, "factor": 3, "margin_s": 30,
        "floor_s": 60, "ceiling_s": 7200,
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"positive|factor|margin|floor"):
        BudgetRule(**(base | knobs))


def test_the_settings_give_the_rule() -> None:
    settings = Settings(
        proof_timeout_s=6,
        end_timeout_s=4,
        proof_timeout_factor=2,
        proof_timeout_margin_s=1,
        proof_timeout_floor_s=2,
        proof_timeout_ceiling_s=50,
    )
    assert settings.budget_rule == BudgetRule(6, 4, 2, 1, 2, 50)
    defaults = Settings().budget_rule
    assert (defaults.factor, defaults.margin_s, defaults.floor_s, defaults.ceiling_s) == (
        3,
        30,
        60,
        7200,
    )
    with pytest.raises(ValidationError, match="FLOOR_S"):
        Settings(proof_timeout_floor_s=100, proof_timeout_ceiling_s=50)
    with pytest.raises(ValidationError):
        Settings(proof_timeout_factor=0.9)


def test_the_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNWARDEN_PROOF_TIMEOUT_FACTOR", "4")
    monkeypatch.setenv("RUNWARDEN_PROOF_TIMEOUT_MARGIN_S", "5")
    monkeypatch.setenv("RUNWARDEN_PROOF_TIMEOUT_FLOOR_S", "10")
    monkeypatch.setenv("RUNWARDEN_PROOF_TIMEOUT_CEILING_S", "20")
    rule = Settings().budget_rule
    assert (rule.factor, rule.margin_s, rule.floor_s, rule.ceiling_s) == (4, 5, 10, 20)


# --- the policies' lead -------------------------------------------------------------


def test_the_save_lead_is_the_factor_times_the_longest_save() -> None:
    assert save_lead_s([], 3) == 0
    assert save_lead_s(samples(10, 400, 30), 3) == 1200


# --- the run's own timeouts ---------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, MAX_TIMEOUT_S + 1, "soon"])
def test_a_bad_timeout_is_refused(bad: Any) -> None:
    with pytest.raises(ValidationError):
        StopTimeouts(proof_timeout_s=bad)
    with pytest.raises(ValidationError):
        StopTimeouts(end_timeout_s=bad)


def test_the_timeouts_ride_on_the_launch_and_the_run_record() -> None:
    spec = LaunchSpec.model_validate(
        {"target": "t", "command": "x", "timeouts": {"proof_timeout_s": 30, "end_timeout_s": 5}}
    )
    assert spec.timeouts == StopTimeouts(proof_timeout_s=30, end_timeout_s=5)
    assert LaunchSpec(target="t", command="x").timeouts == StopTimeouts()
    run = record(timeouts=spec.timeouts)
    assert type(run).model_validate_json(run.model_dump_json()).timeouts == spec.timeouts
    # A record written before the field existed reads as no timeouts of its own.
    old = run.model_dump(mode="json")
    del old["timeouts"]
    assert type(run).model_validate(old).timeouts == StopTimeouts()
    with pytest.raises(ValidationError):
        LaunchSpec.model_validate({"target": "t", "command": "x", "timeouts": {"proof": 3}})


def test_a_stop_keeps_its_budget() -> None:
    budget = stop_budget(StopTimeouts(), samples(2.5), RULE)
    stop = StopState(
        run_id="r1",
        stop_id="abcdef0123456789",
        phase=StopPhase.WAITING_PROOF,
        reason="requested",  # type: ignore[arg-type]
        asked_by="cli",
        asked_at=T0,
        proof_deadline=T0 + timedelta(seconds=budget.proof_timeout_s),
        budget=budget,
    )
    again = StopState.model_validate_json(stop.model_dump_json())
    assert again.budget == budget
    old = stop.model_dump(mode="json")
    del old["budget"]
    assert StopState.model_validate(old).budget is None
    with pytest.raises(ValidationError):
        StopBudget(proof_timeout_s=0, end_timeout_s=1, source=TimeoutSource.DEFAULT, why="")


# --- save lines ---------------------------------------------------------------------


def test_save_lines_become_samples_with_their_step() -> None:
    at = datetime(2026, 5, 1, tzinfo=UTC)
    records = [
        {"event": "log", "step": 1, "seconds": 99},
        {"event": "save", "step": 5, "seconds": 6.0, "step_seconds": 0.5},
        {"event": "save", "step": 10, "seconds": 2},
        {"event": "end", "step": 10},
    ]
    found = save_samples(records, at)
    assert [(s.kind, s.seconds, s.at) for s in found] == [("save", 6.5, at), ("save", 2.0, at)]


@pytest.mark.parametrize(
    "line",
    [
        {"event": "save"},
        {"event": "save", "seconds": None},
        {"event": "save", "seconds": "6"},
        {"event": "save", "seconds": True},
        {"event": "save", "seconds": -1},
        {"event": "save", "seconds": 1e400},
        {"event": "save", "seconds": math.nan},
        {"event": "save", "seconds": 10**400},
        {"event": "save", "seconds": MAX_TIMEOUT_S + 1},
        {"event": "SAVE", "seconds": 3},
        {"seconds": 3},
    ],
)
def test_a_save_line_without_good_seconds_is_ignored(line: dict[str, Any]) -> None:
    assert save_samples([line], T0) == []


def test_a_bad_step_time_is_ignored_and_a_sum_is_capped() -> None:
    [sample] = save_samples([{"event": "save", "seconds": 3, "step_seconds": "x"}], T0)
    assert sample.seconds == 3
    [sample] = save_samples(
        [{"event": "save", "seconds": MAX_TIMEOUT_S, "step_seconds": MAX_TIMEOUT_S}], T0
    )
    assert sample.seconds == MAX_TIMEOUT_S
