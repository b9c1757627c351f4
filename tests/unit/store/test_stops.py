"""`store.stops`: stops (at most one open per run, moved by compare-and-set, kept
in a capped history) and their deadlines (added and removed with the stop, claimed
under a lease)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
import redis

from schemas import StopPhase, StopState
from schemas.errors import NotFound, NotReplicated
from schemas.snapshot import SnapshotReason
from store import RunStore

from .conftest import T0, race, running

# --- stops ------------------------------------------------------------------------


def deadlines_of(store: RunStore) -> list[tuple[str, str, str, datetime]]:
    return [(d.run_id, d.stop_id, d.kind, d.due) for d in store.stops.pending_deadlines()]


def test_open_stop_twice_gives_one_stop_and_one_deadline(store: RunStore) -> None:
    running(store)
    stop, opened = store.stops.open("r1", SnapshotReason.COST, "policy:cost", T0, 1800)
    assert opened
    assert stop.phase is StopPhase.WAITING_PROOF
    assert stop.proof_deadline == T0 + timedelta(seconds=1800)
    assert (stop.reason, stop.asked_by, stop.asked_at) == (SnapshotReason.COST, "policy:cost", T0)
    later = T0 + timedelta(minutes=5)
    again, opened = store.stops.open("r1", SnapshotReason.REQUESTED, "cli", later, 60)
    assert not opened
    assert again == stop  # the first reason stays; no new deadline
    assert deadlines_of(store) == [("r1", stop.stop_id, "proof", stop.proof_deadline)]
    assert store.stops.get("r1") == stop
    assert store.stops.in_progress() == [stop]


def test_open_stop_replace_reason_changes_only_the_reason(store: RunStore) -> None:
    running(store)
    stop, _ = store.stops.open("r1", SnapshotReason.DEADLINE, "policy:deadline", T0, 1800)
    changed, opened = store.stops.open(
        "r1", SnapshotReason.REQUESTED, "cli", T0 + timedelta(hours=1), 5, replace_reason=True
    )
    assert not opened
    assert changed == stop.model_copy(update={"reason": SnapshotReason.REQUESTED})
    assert store.stops.get("r1") == changed
    assert deadlines_of(store) == [("r1", stop.stop_id, "proof", stop.proof_deadline)]


def test_open_stop_refusals(store: RunStore) -> None:
    with pytest.raises(NotFound):
        store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 10)
    running(store)
    with pytest.raises(ValueError, match="seconds"):
        store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 0)
    with pytest.raises(ValueError, match="control"):
        store.stops.open("r1", SnapshotReason.REQUESTED, "cli\nx", T0, 10)
    assert store.stops.get("r1") is None
    assert store.stops.pending_deadlines() == []


def test_open_stop_racing_opens_one(store: RunStore) -> None:
    running(store)
    results = race([lambda: store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)] * 6)
    opened = [r for r in results if isinstance(r, tuple) and r[1]]
    assert len(opened) == 1, results
    stop = opened[0][0]
    assert all(isinstance(r, tuple) and r[0] == stop for r in results)
    assert len(store.stops.pending_deadlines()) == 1


def test_advance_stop_with_stale_ids_changes_nothing(store: RunStore) -> None:
    running(store)
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    end = T0 + timedelta(minutes=40)
    before = (store.stops.get("r1"), deadlines_of(store))
    assert (
        store.stops.advance(
            "r1", "0" * 16, StopPhase.WAITING_PROOF, StopPhase.WAITING_END, end_deadline=end
        )
        is None
    )
    assert (
        store.stops.advance(
            "r1", stop.stop_id, StopPhase.WAITING_END, StopPhase.CANCELLING, end_deadline=end
        )
        is None
    )
    assert store.stops.advance("r2", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.DONE) is None
    assert (store.stops.get("r1"), deadlines_of(store)) == before


def test_advance_stop_moves_its_deadlines(store: RunStore) -> None:
    running(store)
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    end = T0 + timedelta(minutes=10)
    waiting = store.stops.advance(
        "r1",
        stop.stop_id,
        StopPhase.WAITING_PROOF,
        StopPhase.WAITING_END,
        end_deadline=end,
        note="proof at step 40",
    )
    assert waiting is not None
    assert (waiting.phase, waiting.end_deadline, waiting.note) == (
        StopPhase.WAITING_END,
        end,
        "proof at step 40",
    )
    assert deadlines_of(store) == [("r1", stop.stop_id, "end", end)]
    # A duplicate proof_timeout task arriving now changes nothing.
    assert (
        store.stops.advance(
            "r1", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.CANCELLING, note="late"
        )
        is None
    )
    retry = end + timedelta(minutes=1)
    cancelling = store.stops.advance(
        "r1", stop.stop_id, StopPhase.WAITING_END, StopPhase.CANCELLING, end_deadline=retry
    )
    assert cancelling is not None
    assert cancelling.note == "proof at step 40"
    assert deadlines_of(store) == [("r1", stop.stop_id, "end", retry)]
    assert store.stops.get("r1") == cancelling
    bare = store.stops.advance("r1", stop.stop_id, StopPhase.CANCELLING, StopPhase.CANCELLING)
    assert bare is not None
    assert store.stops.pending_deadlines() == []


def test_advance_stop_refuses_bad_moves(store: RunStore) -> None:
    running(store)
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    with pytest.raises(ValueError, match="cannot go"):
        store.stops.advance("r1", stop.stop_id, StopPhase.CANCELLING, StopPhase.WAITING_PROOF)
    with pytest.raises(ValueError, match="end deadline"):
        store.stops.advance("r1", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.WAITING_END)
    assert store.stops.get("r1") == stop


def test_advance_stop_racing_has_one_winner(store: RunStore) -> None:
    running(store)
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    results = race(
        [
            lambda: store.stops.advance(
                "r1", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.CANCELLING
            ),
            lambda: store.stops.advance(
                "r1",
                stop.stop_id,
                StopPhase.WAITING_PROOF,
                StopPhase.WAITING_END,
                end_deadline=T0 + timedelta(minutes=9),
            ),
        ]
        * 2
    )
    winners = [r for r in results if isinstance(r, StopState)]
    assert len(winners) == 1, results
    assert results.count(None) == 3
    assert store.stops.get("r1") == winners[0]


def test_close_stop_archives_and_clears_deadlines(make_store: Callable[..., RunStore]) -> None:
    store = make_store(history_cap=3)
    running(store)
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    store.stops.advance(
        "r1",
        stop.stop_id,
        StopPhase.WAITING_PROOF,
        StopPhase.WAITING_END,
        end_deadline=T0 + timedelta(minutes=5),
    )
    assert store.stops.close("r1", "f" * 16, "wrong stop") is None
    assert store.stops.get("r1") is not None
    closed = store.stops.close("r1", stop.stop_id, "run stopped", now=T0 + timedelta(minutes=2))
    assert closed is not None
    assert (closed.phase, closed.closed_at, closed.note) == (
        StopPhase.DONE,
        T0 + timedelta(minutes=2),
        "run stopped",
    )
    assert store.stops.get("r1") is None
    assert store.stops.in_progress() == []
    assert store.stops.pending_deadlines() == []
    assert store.stops.history("r1") == [closed]
    assert store.stops.close("r1", stop.stop_id) is None  # twice: nothing
    # A new stop after the first one closed; the history keeps the newest 3.
    ids = []
    for i in range(4):
        new, opened = store.stops.open("r1", SnapshotReason.DISK, "policy:disk", T0, 30)
        assert opened
        assert new.stop_id != stop.stop_id
        ids.append(new.stop_id)
        done = (
            store.stops.close("r1", None, f"closed {i}")
            if i % 2
            else store.stops.advance("r1", new.stop_id, StopPhase.WAITING_PROOF, StopPhase.DONE)
        )
        assert done is not None
        assert done.phase is StopPhase.DONE
    assert [s.stop_id for s in store.stops.history("r1")] == ids[::-1][:3]


def test_list_stops_oldest_first(store: RunStore) -> None:
    for i in range(3):
        running(store, f"r{i}")
        store.stops.open(f"r{i}", SnapshotReason.REQUESTED, "cli", T0 - timedelta(minutes=i), 30)
    assert [s.run_id for s in store.stops.in_progress()] == ["r2", "r1", "r0"]


# --- deadlines --------------------------------------------------------------------


def test_due_deadlines_in_order(store: RunStore) -> None:
    for i, delay in enumerate([50, 10, 30, 70, 20]):
        running(store, f"r{i}")
        store.stops.open(f"r{i}", SnapshotReason.REQUESTED, "cli", T0, delay)
    now = T0 + timedelta(seconds=40)
    due = store.stops.due_deadlines(now, limit=10)
    assert [(d.run_id, d.kind) for d in due] == [("r1", "proof"), ("r4", "proof"), ("r2", "proof")]
    assert [d.due for d in due] == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]
    assert [d.run_id for d in store.stops.due_deadlines(now, limit=2)] == ["r1", "r4"]
    assert store.stops.due_deadlines(T0) == []
    assert len(store.stops.due_deadlines(T0 + timedelta(days=1))) == 5
    # Exactly at its due time, a deadline is due.
    assert [d.run_id for d in store.stops.due_deadlines(T0 + timedelta(seconds=10))] == ["r1"]


def test_claim_deadline_is_exclusive(store: RunStore) -> None:
    running(store)
    store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    (deadline,) = store.stops.due_deadlines(T0 + timedelta(hours=1))
    assert store.stops.claim_deadline(deadline, "w1", 0.3)
    assert not store.stops.claim_deadline(deadline, "w2", 10)
    time.sleep(0.4)  # the lease expired: a reconciler may fire it again
    results = race(
        [functools.partial(store.stops.claim_deadline, deadline, f"w{i}", 10) for i in range(6)]
    )
    assert sorted(map(bool, results)) == [False] * 5 + [True]
    assert store.stops.remove_deadline(deadline)
    assert not store.stops.remove_deadline(deadline)
    assert store.stops.due_deadlines(T0 + timedelta(hours=1)) == []


def test_claim_of_a_deadline_no_longer_pending_fails(store: RunStore) -> None:
    running(store)
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    (deadline,) = store.stops.pending_deadlines()
    store.stops.close("r1", stop.stop_id)
    assert not store.stops.claim_deadline(deadline, "w1", 10)
    with pytest.raises(ValueError, match="seconds"):
        store.stops.claim_deadline(deadline, "w1", 0)


def test_malformed_deadline_member_is_dropped(store: RunStore, redis_client: redis.Redis) -> None:
    redis_client.zadd("rw:deadlines", {"garbage": 1.0, "r1|short|proof": 2.0})
    assert store.stops.due_deadlines(T0) == []
    assert redis_client.zcard("rw:deadlines") == 0


# The real server only: fakeredis has no replication to wait for.
@pytest.mark.parametrize("redis_client", ["real"], indirect=True)
def test_a_deadline_write_no_replica_acknowledged_fails_and_a_retry_finds_it(
    make_store: Callable[..., RunStore], redis_client: redis.Redis
) -> None:
    """With `min_replicas`, a stop's write waits for that many replicas (Redis's
    `WAIT`): on a server without one it raises `NotReplicated` after the wait, though
    the primary holds the write; asked again, the stop is found, not opened twice."""
    waiting = make_store(min_replicas=1, wait_s=0.05)
    running(waiting)
    with pytest.raises(NotReplicated, match="0 of 1 replica"):
        waiting.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 60)
    again, opened = make_store().stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 60)
    assert not opened
    assert len(deadlines_of(waiting)) == 1
    with pytest.raises(NotReplicated):
        waiting.stops.close("r1", again.stop_id)
    assert make_store().stops.get("r1") is None  # closed on the primary all the same
