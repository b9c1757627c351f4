"""`store.runs`: run records: created once, listed, updated and moved through
their states by compare-and-set, with their ends queuing their retrievals."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from schemas.errors import Conflict, InvalidRunId, NotFound, StoreError
from schemas.job import JobId
from schemas.run import ArtifactsPhase, RunRecord, RunState
from store import RunStore
from store.steps import end_run

from ..conftest import record as running_record
from ..workers.conftest import ended_run
from .conftest import JOB, SNAP, T0, race, record, running


def test_create_and_get_run(store: RunStore) -> None:
    rec = record("r1", command="python train.py")
    assert store.runs.create(rec)
    assert store.runs.get("r1") == rec
    assert not store.runs.create(record("r1", target="other"))
    assert store.runs.get("r1") == rec
    with pytest.raises(NotFound, match="r2"):
        store.runs.get("r2")
    with pytest.raises(InvalidRunId):
        store.runs.get("../etc")


def test_list_runs_newest_first_and_filtered(store: RunStore) -> None:
    for i in range(6):
        store.runs.create(
            record(f"r{i}", target="a" if i % 2 else "b", created=T0 + timedelta(minutes=i))
        )
    store.runs.transition("r4", RunState.RUNNING)
    assert [r.id for r in store.runs.find()] == ["r5", "r4", "r3", "r2", "r1", "r0"]
    assert [r.id for r in store.runs.find(target="a")] == ["r5", "r3", "r1"]
    assert [r.id for r in store.runs.find(states={RunState.RUNNING})] == ["r4"]
    assert [r.id for r in store.runs.find(target="a", states={RunState.RUNNING})] == []
    assert [r.id for r in store.runs.find(limit=2)] == ["r5", "r4"]
    assert store.runs.find(target="nowhere") == []


def test_update_run(store: RunStore) -> None:
    store.runs.create(record("r1"))
    new = store.runs.update("r1", lambda r: r.model_copy(update={"message": "hello"}))
    assert new.message == "hello" == store.runs.get("r1").message
    assert store.runs.update("r1", lambda r: None) == new
    moved = store.runs.update("r1", lambda r: r.model_copy(update={"target": "gpu"}))
    assert moved.target == "gpu"
    assert [r.id for r in store.runs.find(target="gpu")] == ["r1"]
    assert store.runs.find(target="local") == []
    with pytest.raises(ValueError, match="id"):
        store.runs.update("r1", lambda r: r.model_copy(update={"id": "r9"}))
    with pytest.raises(NotFound):
        store.runs.update("r9", lambda r: r)


def test_update_run_validates_the_new_record(store: RunStore) -> None:
    store.runs.create(record("r1"))
    with pytest.raises(ValueError, match="absolute"):
        store.runs.update("r1", lambda r: r.model_copy(update={"remote_dir": "relative"}))
    assert store.runs.get("r1").remote_dir == "/work/r1"


def test_update_run_exception_changes_nothing(store: RunStore) -> None:
    store.runs.create(record("r1"))

    def boom(r: RunRecord) -> RunRecord:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        store.runs.update("r1", boom)
    assert store.runs.get("r1") == record("r1")


def test_transition_forward(store: RunStore) -> None:
    store.runs.create(record("r1", message="preparing"))
    run = store.runs.transition("r1", RunState.RUNNING, job=JOB, expect={RunState.PREPARING})
    assert (run.state, run.job, run.message) == (RunState.RUNNING, JOB, None)
    run, changed = store.runs.apply_transition("r1", RunState.RUNNING, message="step 3")
    assert changed
    assert run.message == "step 3"
    run, changed = store.runs.apply_transition("r1", RunState.RUNNING)
    assert not changed
    assert run.message == "step 3"
    run, changed = store.runs.apply_transition(
        "r1", RunState.STOPPED, message="stopped at 40", snapshot=SNAP, expect={RunState.RUNNING}
    )
    assert changed
    assert (run.state, run.snapshot, run.message, run.job) == (
        RunState.STOPPED,
        SNAP,
        "stopped at 40",
        JOB,
    )
    assert store.runs.get("r1") == run


def test_terminal_state_is_never_overwritten(store: RunStore) -> None:
    running(store)
    ended = store.runs.transition("r1", RunState.STOPPED, message="first", snapshot=SNAP)
    # The same terminal state again: a no-op, whatever expect says; the first message stays.
    again, changed = store.runs.apply_transition(
        "r1", RunState.STOPPED, message="second", expect={RunState.RUNNING}
    )
    assert not changed
    assert again == ended
    for other in (RunState.CANCELLED, RunState.FAILED, RunState.SUCCEEDED, RunState.RUNNING):
        with pytest.raises(Conflict, match="already ended as stopped") as info:
            store.runs.transition("r1", other, message="late")
        assert (info.value.run_id, info.value.state, info.value.wanted) == (
            "r1",
            "stopped",
            str(other),
        )
    assert store.runs.get("r1") == ended


def test_transition_expect_and_order(store: RunStore) -> None:
    store.runs.create(record("r1"))
    with pytest.raises(Conflict, match="is preparing, not running"):
        store.runs.transition("r1", RunState.CANCELLED, expect={RunState.RUNNING})
    store.runs.transition("r1", RunState.RUNNING)
    with pytest.raises(Conflict, match="cannot go back"):
        store.runs.transition("r1", RunState.PREPARING)
    assert store.runs.get("r1").state is RunState.RUNNING
    with pytest.raises(NotFound):
        store.runs.transition("nope", RunState.RUNNING)


def test_two_threads_racing_transitions(store: RunStore) -> None:
    for i in range(20):
        run_id = f"race{i}"
        running(store, run_id)
        results = race(
            [
                functools.partial(
                    store.runs.apply_transition,
                    run_id,
                    RunState.STOPPED,
                    snapshot=SNAP,
                    expect={RunState.RUNNING},
                ),
                functools.partial(
                    store.runs.apply_transition,
                    run_id,
                    RunState.CANCELLED,
                    expect={RunState.RUNNING},
                ),
            ]
        )
        winners = [r for r in results if isinstance(r, tuple) and r[1]]
        losers = [r for r in results if isinstance(r, Conflict)]
        assert len(winners) == 1, results
        assert len(losers) == 1, results
        assert store.runs.get(run_id).state is winners[0][0].state


def test_same_outcome_recorded_by_two_workers_changes_once(store: RunStore) -> None:
    running(store)
    results = race(
        [lambda: store.runs.apply_transition("r1", RunState.CANCELLED, expect={RunState.RUNNING})]
        * 4
    )
    assert sorted(r[1] for r in results) == [False, False, False, True]  # type: ignore[index]


def test_concurrent_updates_lose_nothing(make_store: Callable[..., RunStore]) -> None:
    store = make_store(max_attempts=10_000)
    store.runs.create(record("r1", message=""))

    def add(mark: str) -> Callable[[], object]:
        def work() -> object:
            for _ in range(15):
                store.runs.update(
                    "r1", lambda r: r.model_copy(update={"message": (r.message or "") + mark})
                )
            return None

        return work

    results = race([add(m) for m in "abcd"])
    assert results == [None] * 4
    message = store.runs.get("r1").message or ""
    assert sorted(message) == sorted("abcd" * 15)


def test_a_writer_that_keeps_losing_gives_up_after_its_attempts(
    make_store: Callable[..., RunStore], redis_client: redis.Redis
) -> None:
    """The compare-and-set is bounded: when another writer changes the watched record
    between every read and write, the update stops after `max_attempts` tries with
    `Conflict`, and nothing of it is written."""
    store = make_store(max_attempts=3)
    store.runs.create(record("r1", message="first"))
    tries: list[int] = []

    def mutate(run: RunRecord) -> RunRecord:
        tries.append(1)
        # Another writer, between this attempt's read and its write.
        redis_client.set("rw:run:r1", store.client.get("rw:run:r1") or b"")
        return run.model_copy(update={"message": "lost"})

    with pytest.raises(Conflict, match="too many writers"):
        store.runs.update("r1", mutate)
    assert len(tries) == 3
    assert store.runs.get("r1").message == "first"


def test_unreadable_record_is_a_store_error(store: RunStore, redis_client: redis.Redis) -> None:
    redis_client.set("rw:run:r1", b"{not json")
    with pytest.raises(StoreError, match="record of run 'r1' is unreadable"):
        store.runs.get("r1")


def test_started_and_ended_are_stamped_by_the_transitions(store: RunStore) -> None:
    assert store.runs.create(running_record(state=RunState.PREPARING, started=None, job=None))
    running = store.runs.transition("r1", RunState.RUNNING, job=JobId(dir="/tmp/x/r1", pid=4242))
    assert running.started is not None
    assert running.ended is None
    ended = store.runs.transition("r1", RunState.FAILED, message="x")
    assert ended.ended is not None
    assert ended.started == running.started


def test_the_end_and_the_queued_retrieval_are_one_transaction(
    store: RunStore, tmp_path: Path
) -> None:
    ended_run(store, tmp_path)
    ended = store.runs.transition("e1", RunState.CANCELLED)
    assert ended.artifacts is not None
    assert ended.artifacts.phase is ArtifactsPhase.PENDING
    assert [r for r, _ in store.retrievals.pending()] == ["e1"]
    # A run that never had a job has nothing to retrieve.
    assert store.runs.create(running_record(id="nojob", job=None, state=RunState.PREPARING))
    assert store.runs.transition("nojob", RunState.FAILED).artifacts is None


def test_runs_are_counted_by_state_without_reading_a_record(store: RunStore) -> None:
    """Every write of a record moves its run between the sets of runs by state (the
    creation, a transition, a launch's start, an end): the counts follow, read in one
    round trip; a store from before those sets gets them once from its records."""
    assert store.runs.count_by_state()[RunState.RUNNING] == 0
    for run_id in ("a", "b", "c"):
        assert store.runs.create(record(run_id))
    store.launches.start("a", JOB)
    running(store, "d")
    running(store, "e")
    end_run(store, "e", RunState.SUCCEEDED)
    counts = store.runs.count_by_state()
    assert (counts[RunState.PREPARING], counts[RunState.RUNNING]) == (2, 2)
    assert (counts[RunState.SUCCEEDED], sum(counts.values())) == (1, 5)
    # A store from before the sets (none of them, no marker): built once from records.
    for state in RunState:
        store.client.delete(store.keys.runs_in(str(state)))
    store.client.delete(store.keys.runs_by_state)
    store.client.sadd(store.keys.runs_in("failed"), "a")  # a stale entry is cleared
    assert store.runs.count_by_state() == counts
    assert store.client.get(store.keys.runs_by_state) is not None
