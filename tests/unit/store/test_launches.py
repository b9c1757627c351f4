"""`store/launches.py` and the launch parts of `Runs.create`: the map from a launch's
idempotency key to its run, the index of preparing runs kept in step with the
records, and `Launches.start` (running and followed in one step). fakeredis with Lua."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import fakeredis
import pytest

from schemas import Conflict, JobId, NotFound, RunRecord, RunState, SchemaError
from store import RunStore
from store.steps import end_run

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def store() -> Iterator[RunStore]:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield RunStore(client)
    client.close()


def record(run_id: str, created: datetime = T0, state: RunState = RunState.PREPARING) -> RunRecord:
    return RunRecord(
        id=run_id, target="local", created=created, remote_dir=f"/w/{run_id}", state=state
    )


def job(run_id: str, pid: int = 4242) -> JobId:
    return JobId(dir=f"/w/{run_id}", pid=pid)


def index(store: RunStore) -> tuple[list[str], dict[str, str]]:
    """The preparing index and its keys, as stored."""
    client = store.client
    ids = [i.decode() for i in client.zrange(store.keys.preparing, 0, -1)]
    keys = {k.decode(): v.decode() for k, v in client.hgetall(store.keys.preparing_keys).items()}
    return ids, keys


def test_a_launch_key_maps_to_its_run_with_the_record(store: RunStore) -> None:
    assert store.launches.launch("k1") is None
    assert store.runs.create(record("r1"), key="k1")
    assert store.launches.launch("k1") == "r1"
    assert index(store) == (["r1"], {"r1": "k1"})
    assert store.launches.preparing(T0) == [("r1", "k1")]
    assert store.runs.find() == [store.runs.get("r1")]


def test_a_used_key_refuses_another_run_and_changes_nothing(store: RunStore) -> None:
    assert store.runs.create(record("r1"), key="k1")
    with pytest.raises(Conflict, match="k1"):
        store.runs.create(record("r2"), key="k1")
    with pytest.raises(NotFound):
        store.runs.get("r2")
    assert store.launches.launch("k1") == "r1"
    assert index(store) == (["r1"], {"r1": "k1"})
    # Nor may a run that is not the key's claim to replace it.
    with pytest.raises(Conflict):
        store.runs.create(record("r2"), key="k1", replaces="r9")


def test_a_creation_retried_after_a_lost_reply_answers_created_again(store: RunStore) -> None:
    assert store.runs.create(record("r1"), key="k1")
    before = store.runs.get("r1")
    assert store.runs.create(record("r1"), key="k1")
    assert store.runs.get("r1") == before
    assert index(store) == (["r1"], {"r1": "k1"})


def test_a_taken_directory_moves_the_key_to_the_next_run(store: RunStore) -> None:
    assert store.runs.create(record("r1"), key="k1")
    store.runs.transition("r1", RunState.FAILED, message="run directory taken")
    assert store.runs.create(record("r1-2"), key="k1", replaces="r1")
    assert store.launches.launch("k1") == "r1-2"
    assert index(store) == (["r1-2"], {"r1-2": "k1"})


def test_an_id_taken_keeps_the_key_free(store: RunStore) -> None:
    assert store.runs.create(record("r1"))
    assert not store.runs.create(record("r1"), key="k1")
    assert store.launches.launch("k1") is None
    assert index(store) == (["r1"], {})  # the first, keyless record


def test_a_run_created_running_is_not_preparing(store: RunStore) -> None:
    adopted = record("r1", state=RunState.RUNNING).model_copy(update={"job": job("r1")})
    assert store.runs.create(adopted)
    assert index(store) == ([], {})


@pytest.mark.parametrize("to_state", [RunState.RUNNING, RunState.FAILED])
def test_leaving_preparing_leaves_the_index_in_the_same_transaction(
    store: RunStore, to_state: RunState
) -> None:
    assert store.runs.create(record("r1"), key="k1")
    assert store.runs.create(record("r2"), key="k2")
    store.runs.transition("r1", to_state, job=job("r1") if to_state is RunState.RUNNING else None)
    assert index(store) == (["r2"], {"r2": "k2"})
    assert store.launches.launch("k1") == "r1"  # the key stays with its run


def test_an_update_that_stays_preparing_keeps_the_index(store: RunStore) -> None:
    assert store.runs.create(record("r1"), key="k1")
    store.runs.update("r1", lambda r: r.model_copy(update={"message": "uploading"}))
    assert index(store) == (["r1"], {"r1": "k1"})


def test_end_run_of_a_preparing_run_leaves_the_index(store: RunStore) -> None:
    assert store.runs.create(record("r1"), key="k1")
    end_run(store, "r1", RunState.FAILED, message="gone")
    assert index(store) == ([], {})


def test_start_run_records_running_and_follows_at_once(store: RunStore) -> None:
    assert store.runs.create(record("r1"), key="k1")
    started, changed = store.launches.start("r1", job("r1"))
    assert changed
    assert started.state is RunState.RUNNING
    assert started.job == job("r1")
    assert started.started is not None
    assert store.runs.get("r1") == started
    assert store.follow.runs("local") == ["r1"]
    assert store.follow.targets() == ["local"]
    assert index(store) == ([], {})


def test_start_run_again_with_its_job_only_follows_again(store: RunStore) -> None:
    assert store.runs.create(record("r1"))
    first, _ = store.launches.start("r1", job("r1"))
    store.follow.remove("r1")
    again, changed = store.launches.start("r1", job("r1"))
    assert not changed
    assert again == first
    assert store.follow.runs("local") == ["r1"]


def test_start_run_refuses_another_job_or_an_ended_run(store: RunStore) -> None:
    assert store.runs.create(record("r1"))
    store.launches.start("r1", job("r1"))
    with pytest.raises(Conflict, match="running, not preparing"):
        store.launches.start("r1", job("r1", pid=777))
    assert store.runs.get("r1").job == job("r1")
    assert store.runs.create(record("r2"))
    store.runs.transition("r2", RunState.FAILED)
    with pytest.raises(Conflict, match="already ended"):
        store.launches.start("r2", job("r2"))
    assert store.follow.runs("local") == ["r1"]
    with pytest.raises(NotFound):
        store.launches.start("nope", job("nope"))


def test_preparing_runs_are_listed_oldest_first_up_to_a_time(store: RunStore) -> None:
    for n, run_id in enumerate(["c", "a", "b"]):
        assert store.runs.create(record(run_id, T0 + timedelta(minutes=n)), key=f"k-{run_id}")
    assert store.runs.create(record("old", T0 - timedelta(days=1)))  # no key
    assert store.runs.create(record("young", T0 + timedelta(hours=1)), key="k-young")
    assert store.launches.preparing(T0 + timedelta(minutes=1)) == [
        ("old", None),
        ("c", "k-c"),
        ("a", "k-a"),
    ]
    found = store.launches.preparing(T0 + timedelta(days=1), limit=2)
    assert found == [("old", None), ("c", "k-c")]
    with pytest.raises(ValueError, match="limit"):
        store.launches.preparing(T0, limit=0)


def test_forget_preparing_repairs_only_entries_of_runs_not_preparing(store: RunStore) -> None:
    assert store.runs.create(record("r1"), key="k1")
    assert not store.launches.forget("r1")  # preparing: kept
    # An entry left behind (a writer that bypassed the store), and one of a lost record.
    store.client.set(store.keys.run("r1"), record("r1", state=RunState.FAILED).model_dump_json())
    store.client.zadd(store.keys.preparing, {"gone": 1.0})
    assert store.launches.forget("r1")
    assert store.launches.forget("gone")
    assert index(store) == ([], {})


@pytest.mark.parametrize(
    "bad",
    ["", "a:b", "a|b", "a b", "$(touch x)", "`x`", "a\nb", "'q'", "-k", ".k", "k/../x", "é",
     "k" * 129],
)  # fmt: skip
def test_a_hostile_key_never_reaches_redis(store: RunStore, bad: str) -> None:
    with pytest.raises(SchemaError, match=r"invalid launch key"):
        store.runs.create(record("r1"), key=bad)
    with pytest.raises(ValueError, match=r"invalid launch key"):
        store.launches.launch(bad)
    assert store.client.keys("*") == []
