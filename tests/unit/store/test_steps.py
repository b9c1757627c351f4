"""`store/steps.py` (`end_run`): a run's end, its stop's close and the end of its follow in one
transaction (fakeredis with Lua)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import fakeredis
import pytest

from schemas import (
    ArtifactsPhase,
    Conflict,
    JobId,
    NotFound,
    RunRecord,
    RunState,
    Snapshot,
    SnapshotReason,
    StopPhase,
)
from store import RunStore
from store.steps import end_run

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SNAP = Snapshot(checkpoint="output/checkpoint-40", step=40, reason=SnapshotReason.COST)


@pytest.fixture
def store() -> Iterator[RunStore]:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield RunStore(client)
    client.close()


def running(store: RunStore, run_id: str = "r1") -> RunRecord:
    record = RunRecord(id=run_id, target="local", created=T0, remote_dir=f"/work/{run_id}")
    assert store.runs.create(record)
    job = JobId(dir=f"/work/{run_id}", pid=4242)
    running = store.runs.transition(run_id, RunState.RUNNING, job=job)
    store.follow.add(run_id)
    return running


def test_the_end_closes_the_stop_and_the_follow_at_once(store: RunStore) -> None:
    running(store)
    stop, opened = store.stops.open("r1", SnapshotReason.COST, "cli", T0, 60)
    assert opened
    assert len(store.stops.pending_deadlines()) == 1
    record, changed = end_run(store,
        "r1", RunState.STOPPED, message="stopped", snapshot=SNAP, note="the run ended stopped"
    )
    assert changed
    assert record.state is RunState.STOPPED
    assert record.snapshot == SNAP
    assert store.runs.get("r1") == record
    assert store.stops.get("r1") is None
    assert store.stops.in_progress() == []
    assert store.stops.pending_deadlines() == []
    (closed,) = store.stops.history("r1")
    assert closed.stop_id == stop.stop_id
    assert closed.phase is StopPhase.DONE
    assert closed.note == "the run ended stopped"
    assert store.follow.runs("local") == []
    assert store.follow.targets() == []
    assert record.artifacts is not None
    assert record.artifacts.phase is ArtifactsPhase.PENDING
    assert [run_id for run_id, _ in store.retrievals.pending()] == ["r1"]


def test_the_end_without_a_stop_still_ends_the_follow(store: RunStore) -> None:
    running(store)
    running(store, "r2")
    record, changed = end_run(store, "r1", RunState.FAILED, message="the job exited with code 3")
    assert changed
    assert record.message == "the job exited with code 3"
    assert store.stops.history("r1") == []
    assert store.follow.runs("local") == ["r2"]
    assert store.follow.targets() == ["local"]


def test_ending_again_changes_nothing_but_finishes_the_rest(store: RunStore) -> None:
    running(store)
    first, changed = end_run(store, "r1", RunState.CANCELLED, note="first")
    assert changed
    # A stop and a follow left by an older end that died half way:
    store.follow.add("r1")
    second, changed = end_run(store, "r1", RunState.CANCELLED, note="second")
    assert not changed
    assert second == first
    assert store.follow.runs("local") == []


def test_a_different_end_is_a_conflict_and_changes_nothing(store: RunStore) -> None:
    running(store)
    store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 60)
    end_run(store, "r1", RunState.SUCCEEDED)
    with pytest.raises(Conflict):
        end_run(store, "r1", RunState.FAILED)
    assert store.runs.get("r1").state is RunState.SUCCEEDED


def test_only_a_terminal_state_ends_a_run(store: RunStore) -> None:
    running(store)
    with pytest.raises(ValueError, match="not the end"):
        end_run(store, "r1", RunState.RUNNING)
    with pytest.raises(NotFound):
        end_run(store, "nope", RunState.FAILED)
