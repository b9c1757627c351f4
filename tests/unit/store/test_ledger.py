"""The ledger, the stored metrics and the webhooks' delivery queue of the run store
(over fake and real Redis): appends in order and all at once, the history of every
run newest first, counters and histograms from any number of writers, and a delivery
list attempted head first, one lease at a time."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from schemas import StoreError
from schemas.ledger import CancelDecided, JobCancelled, LedgerEvent, PolicyDecision
from schemas.metrics import CANCELS, FOLLOW_TICK, PROOF_LATENCY, Sample
from schemas.snapshot import SnapshotReason
from store import RunStore

from .conftest import T0, race


def cancelled(run_id: str, seconds: float) -> LedgerEvent:
    return JobCancelled.of(run_id, T0 + timedelta(seconds=seconds))


def test_events_are_kept_in_the_order_recorded_and_never_trimmed(store: RunStore) -> None:
    events = [cancelled("r1", i) for i in range(300)]  # far past the stop history's cap
    for event in events:
        store.ledger.record(event)
    assert store.ledger.events("r1") == events
    assert store.ledger.events("r1", last=2) == events[-2:]
    assert store.ledger.events("r2") == []
    assert store.ledger.history("r1", limit=3) == events[:-4:-1]


def test_the_history_of_every_run_is_newest_first(store: RunStore) -> None:
    a = [cancelled("a", 1), cancelled("a", 5), cancelled("a", 9)]
    b = [cancelled("b", 2), cancelled("b", 7)]
    c = [cancelled("c", 3)]
    for event in [a[0], b[0], c[0], a[1], b[1], a[2]]:
        store.ledger.record(event)
    assert store.ledger.history(limit=100) == [a[2], b[1], a[1], c[0], b[0], a[0]]
    assert store.ledger.history(limit=2) == [a[2], b[1]]
    with pytest.raises(ValueError, match="limit"):
        store.ledger.history(limit=0)


def test_many_runs_are_read_page_by_page(store: RunStore) -> None:
    events = [cancelled(f"r{i:03d}", i) for i in range(120)]
    for event in events:
        store.ledger.record(event)
    assert store.ledger.history(limit=1000) == events[::-1]
    assert store.ledger.history(limit=7) == events[:-8:-1]


def test_an_unreadable_event_is_a_store_error(store: RunStore) -> None:
    store.client.rpush(store.keys.ledger("r1"), '{"kind": "nonsense"}')
    with pytest.raises(StoreError, match="ledger event of run 'r1' is unreadable"):
        store.ledger.events("r1")


def test_the_event_its_samples_and_its_deliveries_are_recorded_at_once(store: RunStore) -> None:
    event = PolicyDecision.of("r1", SnapshotReason.COST, "cap", T0)
    samples = [Sample(CANCELS, ("manual",), 1.0)]
    with pytest.raises(ValueError, match="invalid webhook name"):
        store.ledger.record(event, samples, [("Bad Name", "{}")])
    # Refused before anything was sent: nothing of it is there.
    assert store.ledger.events("r1") == []
    assert store.counters.series() == []
    store.ledger.record(event, samples, [("ops", '{"id": 1}')], now=T0)
    assert store.ledger.events("r1") == [event]
    assert [s.value for s in store.counters.series()] == [1.0]
    assert store.webhooks.due(T0) == ["ops|r1"]


def test_counters_and_histograms_add_up_from_many_writers(store: RunStore) -> None:
    def write() -> None:
        for value in (0.01, 0.3, 100.0):
            store.counters.add([Sample(FOLLOW_TICK, ("local",), value),
                               Sample(CANCELS, ("proof_timeout",), 1.0)])  # fmt: skip

    race([write] * 4)
    store.counters.add([Sample(PROOF_LATENCY, (), 7.0)])
    series = {(s.spec.name, s.labels): s for s in store.counters.series()}
    assert series[(CANCELS.name, ("proof_timeout",))].value == 12.0
    tick = series[(FOLLOW_TICK.name, ("local",))]
    assert tick.count == 12.0
    assert tick.sum == pytest.approx(4 * 100.31)
    expected = [0.0] * (len(FOLLOW_TICK.buckets) + 1)
    expected[0] = expected[3] = expected[-1] = 4.0  # <= 0.05, <= 0.5, +Inf
    assert tick.buckets == expected
    latency = series[(PROOF_LATENCY.name, ())]
    assert (latency.count, latency.sum) == (1.0, 7.0)
    # A field this version does not know is left out, not an error.
    store.client.hset(store.keys.prom, "garbage", "1")
    store.client.hset(store.keys.prom, json.dumps(["c", "gone_metric", []]), "1")
    assert len(store.counters.series()) == 3
    with pytest.raises(ValueError, match="labels"):
        store.counters.add([Sample(CANCELS, (), 1.0)])


def test_a_delivery_list_is_attempted_head_first_under_one_lease(store: RunStore) -> None:
    for i in range(3):
        store.ledger.record(cancelled("r1", i), deliveries=[("ops", f"d{i}")], now=T0)
    member = "ops|r1"
    assert store.webhooks.pending() == 1
    assert store.webhooks.claim(member, T0, 30)
    assert not store.webhooks.claim(member, T0, 30)  # leased
    assert store.webhooks.due(T0 + timedelta(seconds=29)) == []
    assert store.webhooks.head(member) == ("d0", 0)
    # A failure: tried again after the backoff, the head kept.
    assert store.webhooks.retry(member, "d0", 1, T0 + timedelta(seconds=5))
    assert store.webhooks.due(T0 + timedelta(seconds=4)) == []
    assert store.webhooks.claim(member, T0 + timedelta(seconds=5), 30)
    assert store.webhooks.head(member) == ("d0", 1)
    # Delivered: the next is due at once; a late deliverer's end changes nothing.
    assert store.webhooks.end(member, "d0", T0 + timedelta(seconds=6))
    assert not store.webhooks.end(member, "d0", T0 + timedelta(seconds=6))
    assert not store.webhooks.retry(member, "d0", 2, T0)
    assert store.webhooks.due(T0 + timedelta(seconds=6)) == [member]
    assert store.webhooks.claim(member, T0 + timedelta(seconds=6), 30)
    assert store.webhooks.head(member) == ("d1", 0)
    # Given up: recorded, and the next goes on.
    failure = {"webhook": "ops", "run_id": "r1", "event_id": "x", "attempts": 3, "error": "500"}
    assert store.webhooks.end(member, "d1", T0 + timedelta(seconds=7), failure)
    assert store.webhooks.failures() == [failure]
    assert store.webhooks.claim(member, T0 + timedelta(seconds=7), 30)
    assert store.webhooks.head(member) == ("d2", 0)
    assert store.webhooks.end(member, "d2", T0 + timedelta(seconds=8))
    assert store.webhooks.pending() == 0
    assert store.webhooks.due(T0 + timedelta(days=1)) == []


def test_a_new_delivery_waits_for_the_list_s_turn(store: RunStore) -> None:
    store.ledger.record(cancelled("r1", 0), deliveries=[("ops", "d0")], now=T0)
    assert store.webhooks.claim("ops|r1", T0, 30)
    # Recorded while d0 is being attempted: it does not make the list due again.
    store.ledger.record(cancelled("r1", 1), deliveries=[("ops", "d1")], now=T0)
    assert store.webhooks.due(T0 + timedelta(seconds=1)) == []
    # Another run's list, or another webhook's, has its own turn.
    store.ledger.record(cancelled("r2", 1), deliveries=[("ops", "e0"), ("chat", "c0")], now=T0)
    assert sorted(store.webhooks.due(T0)) == ["chat|r2", "ops|r2"]


def test_two_deliverers_racing_for_one_list_get_one_lease(store: RunStore) -> None:
    store.ledger.record(cancelled("r1", 0), deliveries=[("ops", "d0")], now=T0)
    results = race([lambda: store.webhooks.claim("ops|r1", T0, 30)] * 8)
    assert results.count(True) == 1


def test_a_manual_cancel_is_recorded_as_such(store: RunStore) -> None:
    store.ledger.record(CancelDecided.manual("r1", T0))
    (event,) = store.ledger.events("r1")
    assert isinstance(event, CancelDecided)
    assert (event.cause, event.due, event.stop_id) == ("manual", None, None)
