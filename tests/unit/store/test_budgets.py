"""`store.budgets`: the save samples of runs (bounded to the newest, pushed once with
the metrics lines that report them, carried over to a resumed run), and the budget a
stop keeps."""

from __future__ import annotations

from datetime import timedelta

from schemas import RunState, StopPhase
from schemas.budget import BudgetRule, SaveSample, StopBudget, TimeoutSource
from schemas.snapshot import SnapshotReason
from store import Offsets, RunStore
from store.budgets import SAVES_KEPT

from .conftest import T0, race, record, running


def sample(seconds: float, kind: str = "stop") -> SaveSample:
    return SaveSample(kind=kind, seconds=seconds, at=T0)  # type: ignore[arg-type]


def test_samples_are_kept_newest_first_and_bounded(store: RunStore) -> None:
    assert store.budgets.saves("r1") == []
    for i in range(SAVES_KEPT + 5):
        store.budgets.record_save("r1", sample(float(i)))
    kept = store.budgets.saves("r1")
    assert [s.seconds for s in kept] == [float(i) for i in reversed(range(5, SAVES_KEPT + 5))]
    length = store.client.llen(store.keys.saves("r1"))
    assert length == SAVES_KEPT


def test_an_unreadable_sample_is_skipped(store: RunStore) -> None:
    store.budgets.record_save("r1", sample(3))
    store.client.lpush(store.keys.saves("r1"), b"not json", b'{"kind": "x", "seconds": 1}')
    assert [s.seconds for s in store.budgets.saves("r1")] == [3]


def test_save_lines_become_samples_once_with_their_lines(store: RunStore) -> None:
    records = [
        {"event": "log", "time": 1.0, "step": 4, "loss": 0.5},
        {"event": "save", "time": 2.0, "step": 5, "seconds": 6.0, "step_seconds": 0.25},
        {"event": "save", "time": 3.0, "step": 10, "seconds": "slow"},  # ignored
    ]
    start, end = Offsets(0, 0), Offsets(0, 300)
    assert store.follow.record_tail(
        "r1", lines=[], records=records, from_offsets=start, to_offsets=end
    )
    # Another follower that read the same bytes records nothing: no sample twice.
    results = race(
        [
            lambda: store.follow.record_tail(
                "r1", lines=[], records=records, from_offsets=start, to_offsets=end
            )
        ]
        * 3
    )
    assert not any(results)
    [saved] = store.budgets.saves("r1")
    assert (saved.kind, saved.seconds) == ("save", 6.25)
    assert len(store.follow.read_metrics("r1")) == 3  # the lines are kept as they were
    store.follow.append_metrics("r1", [{"event": "save", "seconds": 1}])
    assert [s.seconds for s in store.budgets.saves("r1")] == [1, 6.25]


def test_a_resumed_run_learns_from_its_sources(store: RunStore) -> None:
    store.runs.create(record("a1", state=RunState.STOPPED))
    store.runs.create(record("a2", state=RunState.STOPPED, resumed_from="a1"))
    store.runs.create(record("a3", resumed_from="a2"))
    store.budgets.record_save("a1", sample(40))
    store.budgets.record_save("a2", sample(2))
    store.budgets.record_save("a2", sample(3))
    assert [s.seconds for s in store.budgets.learned(store.runs.get("a3"))] == [3, 2, 40]
    store.budgets.record_save("a3", sample(1))
    assert [s.seconds for s in store.budgets.learned(store.runs.get("a3"))] == [1, 3, 2, 40]
    assert [s.seconds for s in store.budgets.learned(store.runs.get("a1"))] == [40]
    # Bounded: the newest SAVES_KEPT, the run's own first.
    for _ in range(SAVES_KEPT):
        store.budgets.record_save("a3", sample(1))
    assert [s.seconds for s in store.budgets.learned(store.runs.get("a3"))] == [1] * SAVES_KEPT


def test_a_missing_source_or_a_cycle_ends_the_walk(store: RunStore) -> None:
    store.runs.create(record("b1", resumed_from="gone"))
    store.budgets.record_save("b1", sample(5))
    assert [s.seconds for s in store.budgets.learned(store.runs.get("b1"))] == [5]
    store.runs.create(record("c1", resumed_from="c2"))
    store.runs.create(record("c2", resumed_from="c1"))
    store.budgets.record_save("c1", sample(1))
    store.budgets.record_save("c2", sample(2))
    assert [s.seconds for s in store.budgets.learned(store.runs.get("c1"))] == [1, 2]


def test_a_stop_keeps_its_budget_through_its_history(store: RunStore) -> None:
    running(store)
    budget = StopBudget(
        proof_timeout_s=8.5, end_timeout_s=4, source=TimeoutSource.LEARNED, why="3 x 2.5 s + 1 s"
    )
    stop, opened = store.stops.open(
        "r1", SnapshotReason.COST, "cli", T0, budget.proof_timeout_s, budget=budget
    )
    assert opened
    assert stop.budget == budget
    assert stop.proof_deadline == T0 + timedelta(seconds=8.5)
    assert store.stops.get("r1") == stop
    moved = store.stops.advance(
        "r1",
        stop.stop_id,
        StopPhase.WAITING_PROOF,
        StopPhase.WAITING_END,
        end_deadline=T0 + timedelta(seconds=20),
    )
    assert moved is not None
    assert moved.budget == budget
    store.stops.close("r1", stop.stop_id, note="done")
    [closed] = store.stops.history("r1")
    assert closed.budget == budget
    # Without a budget, as before: none kept.
    again, _ = store.stops.open("r1", SnapshotReason.COST, "cli", T0, 60)
    assert again.budget is None


# --- the rules the workers publish ---------------------------------------------------


def test_the_workers_rules_are_read_newest_first(store: RunStore) -> None:
    assert store.budgets.rules() == []
    old = BudgetRule(1800.0, 600.0, 3.0, 30.0, 60.0, 7200.0)
    new = BudgetRule(10.0, 4.0, 2.0, 1.0, 5.0, 100.0)
    store.budgets.publish_rule("w1@a", old)
    store.budgets.publish_rule("watch@a", new)
    store.client.hset(store.keys.budget_rules, "garbage@a", "{not json")
    store.client.hset(store.keys.budget_rules, "bad@a", '{"at": 1, "factor": 0.5}')
    rules = store.budgets.rules()
    assert [(p.worker, p.rule) for p in rules] == [("watch@a", new), ("w1@a", old)]
    assert rules[0].at >= rules[1].at
    store.budgets.publish_rule("w1@a", new)  # a worker started again: its rule replaced
    assert [(p.worker, p.rule) for p in store.budgets.rules()] == [("w1@a", new), ("watch@a", new)]
