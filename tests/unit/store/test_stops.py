"""The run store's contract (the `store` package), over fakeredis.

`tests/integration/test_store_redis.py` runs these same test functions against a
real `redis-server` by overriding the `redis_client` fixture; only what needs a real
server (AOF restart, a server that is down) lives there alone. So a test here must
use only `redis_client` / `store` (and `make_store` for other caps), never fakeredis
directly.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest
import redis

from schemas import Deadline, Progress, StopPhase, StopState
from schemas.errors import Conflict, InvalidRunId, NotFound, StoreError, UnknownTarget
from schemas.job import JobId
from schemas.run import RunRecord, RunState
from schemas.snapshot import Snapshot, SnapshotReason
from store import LogEntry, Offsets, RunStore

T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
JOB = JobId(dir="/work/r1", pid=4242)
SNAP = Snapshot(checkpoint="output/checkpoint-40", step=40, reason=SnapshotReason.REQUESTED)


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    """An empty Redis: a private fakeredis server with Lua (lupa)."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield client
    client.close()


@pytest.fixture
def make_store(redis_client: redis.Redis) -> Callable[..., RunStore]:
    """Builds stores over `redis_client`, with other caps or attempts."""

    def make(**kwargs: Any) -> RunStore:
        return RunStore(redis_client, **kwargs)

    return make


@pytest.fixture
def store(make_store: Callable[..., RunStore]) -> RunStore:
    return make_store()


def record(
    run_id: str = "r1",
    *,
    target: str = "local",
    created: datetime = T0,
    state: RunState = RunState.PREPARING,
    **fields: Any,
) -> RunRecord:
    return RunRecord(
        id=run_id,
        target=target,
        created=created,
        remote_dir=f"/work/{run_id}",
        state=state,
        **fields,
    )


def running(store: RunStore, run_id: str = "r1", **fields: Any) -> RunRecord:
    assert store.create_run(record(run_id, **fields))
    return store.transition(run_id, RunState.RUNNING, job=JOB, expect={RunState.PREPARING})


def xlen(store: RunStore, key: str) -> int:
    length: Any = store.client.xlen(key)
    return int(length)


def race(workers: list[Callable[[], object]]) -> list[object]:
    """Runs `workers` in threads released at once; each result or exception."""
    barrier = threading.Barrier(len(workers))
    results: list[object] = [None] * len(workers)

    def run(index: int, work: Callable[[], object]) -> None:
        barrier.wait()
        try:
            results[index] = work()
        except Exception as error:  # noqa: BLE001 - the test inspects it
            results[index] = error

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


# --- targets ------------------------------------------------------------------------


def test_targets_round_trip(store: RunStore) -> None:
    store.put_target("gpu1", {"kind": "ssh", "workdir": "/srv/runs", "host": "gpu1", "port": 22})
    store.put_target("here", {"kind": "local", "workdir": "/tmp/runs"})
    assert store.get_target("gpu1") == {
        "kind": "ssh",
        "workdir": "/srv/runs",
        "host": "gpu1",
        "port": 22,
    }
    assert list(store.list_targets()) == ["gpu1", "here"]
    store.put_target("here", {"kind": "local", "workdir": "/other"})
    assert store.get_target("here")["workdir"] == "/other"
    assert store.remove_target("here")
    assert not store.remove_target("here")
    with pytest.raises(UnknownTarget, match="here"):
        store.get_target("here")


@pytest.mark.parametrize(
    "config",
    [
        {"kind": "ssh", "workdir": "/w", "password": "hunter2"},
        {"kind": "ssh", "workdir": "/w", "auth": {"Passphrase": "x"}},
        {"kind": "docker", "workdir": "/w"},
        {"workdir": "/w"},
        {"kind": "local", "workdir": "/w", "x": float("nan")},
        {"kind": "local", "workdir": "/w", "x": {1, 2}},
    ],
)
def test_target_config_refused(store: RunStore, config: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"secret|kind|JSON"):
        store.put_target("t", config)
    assert store.list_targets() == {}


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "tab\there"])
def test_target_name_refused(store: RunStore, name: str) -> None:
    with pytest.raises(ValueError, match="target name"):
        store.put_target(name, {"kind": "local", "workdir": "/w"})


# --- runs ---------------------------------------------------------------------------


def test_create_and_get_run(store: RunStore) -> None:
    rec = record("r1", command="python train.py")
    assert store.create_run(rec)
    assert store.get_run("r1") == rec
    assert not store.create_run(record("r1", target="other"))
    assert store.get_run("r1") == rec
    with pytest.raises(NotFound, match="r2"):
        store.get_run("r2")
    with pytest.raises(InvalidRunId):
        store.get_run("../etc")


def test_list_runs_newest_first_and_filtered(store: RunStore) -> None:
    for i in range(6):
        store.create_run(
            record(f"r{i}", target="a" if i % 2 else "b", created=T0 + timedelta(minutes=i))
        )
    store.transition("r4", RunState.RUNNING)
    assert [r.id for r in store.list_runs()] == ["r5", "r4", "r3", "r2", "r1", "r0"]
    assert [r.id for r in store.list_runs(target="a")] == ["r5", "r3", "r1"]
    assert [r.id for r in store.list_runs(states={RunState.RUNNING})] == ["r4"]
    assert [r.id for r in store.list_runs(target="a", states={RunState.RUNNING})] == []
    assert [r.id for r in store.list_runs(limit=2)] == ["r5", "r4"]
    assert store.list_runs(target="nowhere") == []


def test_update_run(store: RunStore) -> None:
    store.create_run(record("r1"))
    new = store.update_run("r1", lambda r: r.model_copy(update={"message": "hello"}))
    assert new.message == "hello" == store.get_run("r1").message
    assert store.update_run("r1", lambda r: None) == new
    moved = store.update_run("r1", lambda r: r.model_copy(update={"target": "gpu"}))
    assert moved.target == "gpu"
    assert [r.id for r in store.list_runs(target="gpu")] == ["r1"]
    assert store.list_runs(target="local") == []
    with pytest.raises(ValueError, match="id"):
        store.update_run("r1", lambda r: r.model_copy(update={"id": "r9"}))
    with pytest.raises(NotFound):
        store.update_run("r9", lambda r: r)


def test_update_run_validates_the_new_record(store: RunStore) -> None:
    store.create_run(record("r1"))
    with pytest.raises(ValueError, match="absolute"):
        store.update_run("r1", lambda r: r.model_copy(update={"remote_dir": "relative"}))
    assert store.get_run("r1").remote_dir == "/work/r1"


def test_update_run_exception_changes_nothing(store: RunStore) -> None:
    store.create_run(record("r1"))

    def boom(r: RunRecord) -> RunRecord:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        store.update_run("r1", boom)
    assert store.get_run("r1") == record("r1")


def test_transition_forward(store: RunStore) -> None:
    store.create_run(record("r1", message="preparing"))
    run = store.transition("r1", RunState.RUNNING, job=JOB, expect={RunState.PREPARING})
    assert (run.state, run.job, run.message) == (RunState.RUNNING, JOB, None)
    run, changed = store.apply_transition("r1", RunState.RUNNING, message="step 3")
    assert changed
    assert run.message == "step 3"
    run, changed = store.apply_transition("r1", RunState.RUNNING)
    assert not changed
    assert run.message == "step 3"
    run, changed = store.apply_transition(
        "r1", RunState.STOPPED, message="stopped at 40", snapshot=SNAP, expect={RunState.RUNNING}
    )
    assert changed
    assert (run.state, run.snapshot, run.message, run.job) == (
        RunState.STOPPED,
        SNAP,
        "stopped at 40",
        JOB,
    )
    assert store.get_run("r1") == run


def test_terminal_state_is_never_overwritten(store: RunStore) -> None:
    running(store)
    ended = store.transition("r1", RunState.STOPPED, message="first", snapshot=SNAP)
    # The same terminal state again: a no-op, whatever expect says; the first message stays.
    again, changed = store.apply_transition(
        "r1", RunState.STOPPED, message="second", expect={RunState.RUNNING}
    )
    assert not changed
    assert again == ended
    for other in (RunState.CANCELLED, RunState.FAILED, RunState.SUCCEEDED, RunState.RUNNING):
        with pytest.raises(Conflict, match="already ended as stopped") as info:
            store.transition("r1", other, message="late")
        assert (info.value.run_id, info.value.state, info.value.wanted) == (
            "r1",
            "stopped",
            str(other),
        )
    assert store.get_run("r1") == ended


def test_transition_expect_and_order(store: RunStore) -> None:
    store.create_run(record("r1"))
    with pytest.raises(Conflict, match="is preparing, not running"):
        store.transition("r1", RunState.CANCELLED, expect={RunState.RUNNING})
    store.transition("r1", RunState.RUNNING)
    with pytest.raises(Conflict, match="cannot go back"):
        store.transition("r1", RunState.PREPARING)
    assert store.get_run("r1").state is RunState.RUNNING
    with pytest.raises(NotFound):
        store.transition("nope", RunState.RUNNING)


def test_two_threads_racing_transitions(store: RunStore) -> None:
    for i in range(20):
        run_id = f"race{i}"
        running(store, run_id)
        results = race(
            [
                functools.partial(
                    store.apply_transition,
                    run_id,
                    RunState.STOPPED,
                    snapshot=SNAP,
                    expect={RunState.RUNNING},
                ),
                functools.partial(
                    store.apply_transition, run_id, RunState.CANCELLED, expect={RunState.RUNNING}
                ),
            ]
        )
        winners = [r for r in results if isinstance(r, tuple) and r[1]]
        losers = [r for r in results if isinstance(r, Conflict)]
        assert len(winners) == 1, results
        assert len(losers) == 1, results
        assert store.get_run(run_id).state is winners[0][0].state


def test_same_outcome_recorded_by_two_workers_changes_once(store: RunStore) -> None:
    running(store)
    results = race(
        [lambda: store.apply_transition("r1", RunState.CANCELLED, expect={RunState.RUNNING})] * 4
    )
    assert sorted(r[1] for r in results) == [False, False, False, True]  # type: ignore[index]


def test_concurrent_updates_lose_nothing(make_store: Callable[..., RunStore]) -> None:
    store = make_store(max_attempts=10_000)
    store.create_run(record("r1", message=""))

    def add(mark: str) -> Callable[[], object]:
        def work() -> object:
            for _ in range(15):
                store.update_run(
                    "r1", lambda r: r.model_copy(update={"message": (r.message or "") + mark})
                )
            return None

        return work

    results = race([add(m) for m in "abcd"])
    assert results == [None] * 4
    message = store.get_run("r1").message or ""
    assert sorted(message) == sorted("abcd" * 15)


def test_unreadable_record_is_a_store_error(store: RunStore, redis_client: redis.Redis) -> None:
    redis_client.set("rw:run:r1", b"{not json")
    with pytest.raises(StoreError, match="record of run 'r1' is unreadable"):
        store.get_run("r1")


def test_prefix_isolates_stores(redis_client: redis.Redis) -> None:
    a, b = RunStore(redis_client, prefix="a:"), RunStore(redis_client, prefix="b:")
    a.create_run(record("r1"))
    assert b.list_runs() == []
    with pytest.raises(NotFound):
        b.get_run("r1")


# --- followed runs ------------------------------------------------------------------


def test_follow_and_unfollow(store: RunStore) -> None:
    store.create_run(record("r1", target="a"))
    store.create_run(record("r2", target="a"))
    store.create_run(record("r3", target="b"))
    for run_id in ("r1", "r2", "r3", "r1"):
        store.follow(run_id)
    assert store.followed("a") == ["r1", "r2"]
    assert store.followed_targets() == ["a", "b"]
    assert store.unfollow("r3")
    assert not store.unfollow("r3")
    assert store.followed_targets() == ["a"]
    assert store.unfollow("r1")
    assert store.followed("a") == ["r2"]
    with pytest.raises(NotFound):
        store.follow("r9")


def test_offsets(store: RunStore) -> None:
    assert store.get_offsets("r1") == Offsets(0, 0)
    store.set_offsets("r1", 120, 40)
    assert store.get_offsets("r1") == Offsets(log=120, metrics=40)
    with pytest.raises(ValueError, match="non-negative"):
        store.set_offsets("r1", -1, 0)


def test_record_tail_appends_once(store: RunStore) -> None:
    start, end = Offsets(0, 0), Offsets(12, 30)
    lines, records = ["a", "b"], [{"event": "begin", "time": 1.0, "max_steps": 10}]
    assert store.record_tail("r1", lines=lines, records=records, from_offsets=start, to_offsets=end)
    # A second follower that read the same bytes finds the offsets moved: nothing twice.
    assert not store.record_tail(
        "r1", lines=lines, records=records, from_offsets=start, to_offsets=end
    )
    assert [e.line for e in store.read_log("r1")] == ["a", "b"]
    assert len(store.read_metrics("r1")) == 1
    assert store.get_offsets("r1") == end
    results = race(
        [
            lambda: store.record_tail(
                "r1", lines=["c"], records=[], from_offsets=end, to_offsets=Offsets(14, 30)
            )
        ]
        * 3
    )
    assert sorted(map(bool, results)) == [False, False, True]
    assert [e.line for e in store.read_log("r1")] == ["a", "b", "c"]


# --- stops --------------------------------------------------------------------------


def deadlines_of(store: RunStore) -> list[tuple[str, str, str, datetime]]:
    return [(d.run_id, d.stop_id, d.kind, d.due) for d in store.pending_deadlines()]


def test_open_stop_twice_gives_one_stop_and_one_deadline(store: RunStore) -> None:
    running(store)
    stop, opened = store.open_stop("r1", SnapshotReason.COST, "policy:cost", T0, 1800)
    assert opened
    assert stop.phase is StopPhase.WAITING_PROOF
    assert stop.proof_deadline == T0 + timedelta(seconds=1800)
    assert (stop.reason, stop.asked_by, stop.asked_at) == (SnapshotReason.COST, "policy:cost", T0)
    later = T0 + timedelta(minutes=5)
    again, opened = store.open_stop("r1", SnapshotReason.REQUESTED, "cli", later, 60)
    assert not opened
    assert again == stop  # the first reason stays; no new deadline
    assert deadlines_of(store) == [("r1", stop.stop_id, "proof", stop.proof_deadline)]
    assert store.get_stop("r1") == stop
    assert store.list_stops() == [stop]


def test_open_stop_replace_reason_changes_only_the_reason(store: RunStore) -> None:
    running(store)
    stop, _ = store.open_stop("r1", SnapshotReason.DEADLINE, "policy:deadline", T0, 1800)
    changed, opened = store.open_stop(
        "r1", SnapshotReason.REQUESTED, "cli", T0 + timedelta(hours=1), 5, replace_reason=True
    )
    assert not opened
    assert changed == stop.model_copy(update={"reason": SnapshotReason.REQUESTED})
    assert store.get_stop("r1") == changed
    assert deadlines_of(store) == [("r1", stop.stop_id, "proof", stop.proof_deadline)]


def test_open_stop_refusals(store: RunStore) -> None:
    with pytest.raises(NotFound):
        store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 10)
    running(store)
    with pytest.raises(ValueError, match="seconds"):
        store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 0)
    with pytest.raises(ValueError, match="control"):
        store.open_stop("r1", SnapshotReason.REQUESTED, "cli\nx", T0, 10)
    assert store.get_stop("r1") is None
    assert store.pending_deadlines() == []


def test_open_stop_racing_opens_one(store: RunStore) -> None:
    running(store)
    results = race([lambda: store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)] * 6)
    opened = [r for r in results if isinstance(r, tuple) and r[1]]
    assert len(opened) == 1, results
    stop = opened[0][0]
    assert all(isinstance(r, tuple) and r[0] == stop for r in results)
    assert len(store.pending_deadlines()) == 1


def test_advance_stop_with_stale_ids_changes_nothing(store: RunStore) -> None:
    running(store)
    stop, _ = store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    end = T0 + timedelta(minutes=40)
    before = (store.get_stop("r1"), deadlines_of(store))
    assert (
        store.advance_stop(
            "r1", "0" * 16, StopPhase.WAITING_PROOF, StopPhase.WAITING_END, end_deadline=end
        )
        is None
    )
    assert (
        store.advance_stop(
            "r1", stop.stop_id, StopPhase.WAITING_END, StopPhase.CANCELLING, end_deadline=end
        )
        is None
    )
    assert store.advance_stop("r2", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.DONE) is None
    assert (store.get_stop("r1"), deadlines_of(store)) == before


def test_advance_stop_moves_its_deadlines(store: RunStore) -> None:
    running(store)
    stop, _ = store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    end = T0 + timedelta(minutes=10)
    waiting = store.advance_stop(
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
        store.advance_stop(
            "r1", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.CANCELLING, note="late"
        )
        is None
    )
    retry = end + timedelta(minutes=1)
    cancelling = store.advance_stop(
        "r1", stop.stop_id, StopPhase.WAITING_END, StopPhase.CANCELLING, end_deadline=retry
    )
    assert cancelling is not None
    assert cancelling.note == "proof at step 40"
    assert deadlines_of(store) == [("r1", stop.stop_id, "end", retry)]
    assert store.get_stop("r1") == cancelling
    bare = store.advance_stop("r1", stop.stop_id, StopPhase.CANCELLING, StopPhase.CANCELLING)
    assert bare is not None
    assert store.pending_deadlines() == []


def test_advance_stop_refuses_bad_moves(store: RunStore) -> None:
    running(store)
    stop, _ = store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    with pytest.raises(ValueError, match="cannot go"):
        store.advance_stop("r1", stop.stop_id, StopPhase.CANCELLING, StopPhase.WAITING_PROOF)
    with pytest.raises(ValueError, match="end deadline"):
        store.advance_stop("r1", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.WAITING_END)
    assert store.get_stop("r1") == stop


def test_advance_stop_racing_has_one_winner(store: RunStore) -> None:
    running(store)
    stop, _ = store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    results = race(
        [
            lambda: store.advance_stop(
                "r1", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.CANCELLING
            ),
            lambda: store.advance_stop(
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
    assert store.get_stop("r1") == winners[0]


def test_close_stop_archives_and_clears_deadlines(make_store: Callable[..., RunStore]) -> None:
    store = make_store(history_cap=3)
    running(store)
    stop, _ = store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    store.advance_stop(
        "r1",
        stop.stop_id,
        StopPhase.WAITING_PROOF,
        StopPhase.WAITING_END,
        end_deadline=T0 + timedelta(minutes=5),
    )
    assert store.close_stop("r1", "f" * 16, "wrong stop") is None
    assert store.get_stop("r1") is not None
    closed = store.close_stop("r1", stop.stop_id, "run stopped", now=T0 + timedelta(minutes=2))
    assert closed is not None
    assert (closed.phase, closed.closed_at, closed.note) == (
        StopPhase.DONE,
        T0 + timedelta(minutes=2),
        "run stopped",
    )
    assert store.get_stop("r1") is None
    assert store.list_stops() == []
    assert store.pending_deadlines() == []
    assert store.stop_history("r1") == [closed]
    assert store.close_stop("r1", stop.stop_id) is None  # twice: nothing
    # A new stop after the first one closed; the history keeps the newest 3.
    ids = []
    for i in range(4):
        new, opened = store.open_stop("r1", SnapshotReason.DISK, "policy:disk", T0, 30)
        assert opened
        assert new.stop_id != stop.stop_id
        ids.append(new.stop_id)
        done = (
            store.close_stop("r1", None, f"closed {i}")
            if i % 2
            else store.advance_stop("r1", new.stop_id, StopPhase.WAITING_PROOF, StopPhase.DONE)
        )
        assert done is not None
        assert done.phase is StopPhase.DONE
    assert [s.stop_id for s in store.stop_history("r1")] == ids[::-1][:3]


def test_list_stops_oldest_first(store: RunStore) -> None:
    for i in range(3):
        running(store, f"r{i}")
        store.open_stop(f"r{i}", SnapshotReason.REQUESTED, "cli", T0 - timedelta(minutes=i), 30)
    assert [s.run_id for s in store.list_stops()] == ["r2", "r1", "r0"]


# --- deadlines ----------------------------------------------------------------------


def test_due_deadlines_in_order(store: RunStore) -> None:
    for i, delay in enumerate([50, 10, 30, 70, 20]):
        running(store, f"r{i}")
        store.open_stop(f"r{i}", SnapshotReason.REQUESTED, "cli", T0, delay)
    now = T0 + timedelta(seconds=40)
    due = store.due_deadlines(now, limit=10)
    assert [(d.run_id, d.kind) for d in due] == [("r1", "proof"), ("r4", "proof"), ("r2", "proof")]
    assert [d.due for d in due] == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]
    assert [d.run_id for d in store.due_deadlines(now, limit=2)] == ["r1", "r4"]
    assert store.due_deadlines(T0) == []
    assert len(store.due_deadlines(T0 + timedelta(days=1))) == 5
    # Exactly at its due time, a deadline is due.
    assert [d.run_id for d in store.due_deadlines(T0 + timedelta(seconds=10))] == ["r1"]


def test_claim_deadline_is_exclusive(store: RunStore) -> None:
    running(store)
    store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    (deadline,) = store.due_deadlines(T0 + timedelta(hours=1))
    assert store.claim_deadline(deadline, "w1", 0.3)
    assert not store.claim_deadline(deadline, "w2", 10)
    time.sleep(0.4)  # the lease expired: a reconciler may fire it again
    results = race(
        [functools.partial(store.claim_deadline, deadline, f"w{i}", 10) for i in range(6)]
    )
    assert sorted(map(bool, results)) == [False] * 5 + [True]
    assert store.remove_deadline(deadline)
    assert not store.remove_deadline(deadline)
    assert store.due_deadlines(T0 + timedelta(hours=1)) == []


def test_claim_of_a_deadline_no_longer_pending_fails(store: RunStore) -> None:
    running(store)
    stop, _ = store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    (deadline,) = store.pending_deadlines()
    store.close_stop("r1", stop.stop_id)
    assert not store.claim_deadline(deadline, "w1", 10)
    with pytest.raises(ValueError, match="seconds"):
        store.claim_deadline(deadline, "w1", 0)


def test_malformed_deadline_member_is_dropped(store: RunStore, redis_client: redis.Redis) -> None:
    redis_client.zadd("rw:deadlines", {"garbage": 1.0, "r1|short|proof": 2.0})
    assert store.due_deadlines(T0) == []
    assert redis_client.zcard("rw:deadlines") == 0


def test_deadline_member_round_trip() -> None:
    deadline = Deadline(run_id="r1", stop_id="abcdef0123456789", kind="end", due=T0)
    assert deadline.member == "r1|abcdef0123456789|end"
    assert Deadline.from_member(deadline.member, T0) == deadline
    assert Deadline.model_validate_json(deadline.model_dump_json()) == deadline


# --- streams ------------------------------------------------------------------------


def test_log_stream_is_capped_and_ordered(make_store: Callable[..., RunStore]) -> None:
    store = make_store(log_cap=1000)
    for batch in range(30):
        store.append_log("r1", [f"line {batch * 100 + i}" for i in range(100)])
    length = xlen(store, "rw:log:r1")
    assert 1000 <= length <= 1100  # MAXLEN ~: whole stream nodes (100 entries) are trimmed
    entries = store.read_log("r1", count=5000)
    assert len(entries) == length
    assert entries[-1].line == "line 2999"
    assert [int(e.line.split()[1]) for e in entries] == list(range(3000 - length, 3000))
    page = store.read_log("r1", after_id=entries[10].id, count=3)
    assert page == entries[11:14]
    assert store.read_log("r1", after_id=entries[-1].id) == []


def test_metrics_stream_capped_and_progress_kept(make_store: Callable[..., RunStore]) -> None:
    store = make_store(metrics_cap=500)
    assert store.last_metrics("r1") is None
    store.append_metrics("r1", [{"event": "begin", "time": 1.0, "max_steps": 3000}])
    for batch in range(20):
        store.append_metrics(
            "r1",
            [
                {"event": "log", "time": 2.0 + s, "step": s, "loss": 1.0 / (s + 1)}
                for s in range(batch * 100, batch * 100 + 100)
            ]
            + [{"event": "log", "time": 3000.0, "step": batch * 100 + 99, "lr": 0.1}],
        )
    assert 500 <= xlen(store, "rw:metrics:r1") <= 600
    assert store.last_metrics("r1") == Progress(
        max_steps=3000, step=1999, loss=1.0 / 2000, loss_step=1999, time=3000.0, ended=False
    )
    last = store.read_metrics("r1", count=10_000)[-1]
    assert last.record == {"event": "log", "time": 3000.0, "step": 1999, "lr": 0.1}
    store.append_metrics("r1", [{"event": "end", "time": 4000.0, "step": 2000}])
    progress = store.last_metrics("r1")
    assert progress is not None
    assert (progress.ended, progress.step, progress.loss_step) == (True, 2000, 1999)


def test_metrics_are_strict_json(store: RunStore) -> None:
    store.append_metrics("r1", [{"event": "log", "step": 1, "loss": float("nan"), "x": [1.5]}])
    (entry,) = store.read_metrics("r1")
    assert entry.record == {"event": "log", "step": 1, "loss": None, "x": [1.5]}
    progress = store.last_metrics("r1")
    assert progress is not None
    assert (progress.step, progress.loss) == (1, None)
    with pytest.raises(TypeError):
        store.append_metrics("r1", [{"event": "log", "bad": object()}])
    assert len(store.read_metrics("r1")) == 1


def test_log_lines_any_text(store: RunStore) -> None:
    lines = ["", "tab\tand ünïcode ✓", "lone \udcff surrogate", "x" * 100_000]
    assert store.append_log("r1", lines) is not None
    assert store.append_log("r1", []) is None
    got = [e.line for e in store.read_log("r1")]
    assert got == ["", "tab\tand ünïcode ✓", "lone ? surrogate", "x" * 100_000]


def test_read_log_blocking(store: RunStore) -> None:
    store.append_log("r1", ["a"])
    (first,) = store.read_log("r1", block_ms=1000)
    assert first.line == "a"
    started = time.monotonic()
    assert store.read_log("r1", after_id=first.id, block_ms=200) == []
    assert time.monotonic() - started < 3

    def later() -> None:
        time.sleep(0.2)
        store.append_log("r1", ["b"])

    thread = threading.Thread(target=later)
    thread.start()
    got = store.read_log("r1", after_id=first.id, block_ms=5000)
    thread.join()
    assert [e.line for e in got] == ["b"]
    assert isinstance(got[0], LogEntry)


# --- once ---------------------------------------------------------------------------


def test_once(store: RunStore) -> None:
    assert store.once("cancel:r1:abc", 0.3)
    assert not store.once("cancel:r1:abc", 10)
    assert store.once("cancel:r1:other", 10)
    time.sleep(0.4)
    assert store.once("cancel:r1:abc", 10)
    assert store.forget("cancel:r1:abc")
    assert store.once("cancel:r1:abc", 10)
    results = race([lambda: store.once("effect", 10)] * 5)
    assert sorted(map(bool, results)) == [False] * 4 + [True]


# --- decode_responses and models ----------------------------------------------------


def test_store_over_a_decoding_client(redis_client: redis.Redis) -> None:
    pool = redis_client.connection_pool
    decoding = redis.Redis(
        connection_pool=type(pool)(
            connection_class=pool.connection_class,
            **{**pool.connection_kwargs, "decode_responses": True},
        )
    )
    store = RunStore(decoding, prefix="dec:")
    running(store)
    store.put_target("t", {"kind": "local", "workdir": "/w"})
    assert list(store.list_targets()) == ["t"]
    store.follow("r1")
    assert store.followed("local") == ["r1"]
    stop, _ = store.open_stop("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    assert store.get_stop("r1") == stop
    assert [d.run_id for d in store.due_deadlines(T0 + timedelta(hours=1))] == ["r1"]
    store.append_log("r1", ["a"])
    store.append_metrics("r1", [{"event": "begin", "max_steps": 3}])
    assert [e.line for e in store.read_log("r1")] == ["a"]
    assert store.last_metrics("r1") == Progress(max_steps=3)
    assert store.close_stop("r1") is not None
    decoding.close()


def test_stop_state_json_round_trip() -> None:
    stop = StopState(
        run_id="r1",
        stop_id="abcdef0123456789",
        phase=StopPhase.WAITING_END,
        reason=SnapshotReason.COST,
        asked_by="policy:cost",
        asked_at=datetime(2026, 1, 1, 12),  # naive: taken as UTC
        proof_deadline=T0,
        end_deadline=T0 + timedelta(minutes=10),
        note="proof at step 3",
    )
    assert stop.asked_at.tzinfo is UTC
    assert StopState.model_validate_json(stop.model_dump_json()) == stop
    with pytest.raises(ValueError, match="stop id"):
        StopState.model_validate({**stop.model_dump(), "stop_id": "a|b"})
