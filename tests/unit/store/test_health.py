"""`store.health`: heartbeats with a time to live on Redis's clock, the record of the
periodic tasks' runs, and the one reading `runwarden status` judges (over fakeredis
and a real redis-server, as every store test)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas import SnapshotReason
from schemas.health import HEARTBEAT_BYTES, HEARTBEAT_KEPT_S, Heartbeat
from store import RunStore

from .conftest import running

QUEUES = ("runwarden", "runwarden.retrieve")
TASKS = ("runwarden.follow_tick", "runwarden.reconcile")


def beat(name: str = "w1@h", queues: tuple[str, ...] = QUEUES) -> Heartbeat:
    return Heartbeat(name=name, hostname="h", pid=42, queues=queues)


def dump(store: RunStore) -> dict[str, Any]:
    """Every key with its type and content (a write shows as a difference)."""
    r: Any = store.client
    shown: dict[str, Any] = {}
    for key in sorted(r.keys("*")):
        kind = r.type(key).decode()
        reader = {
            "string": r.get,
            "hash": r.hgetall,
            "list": lambda k: r.lrange(k, 0, -1),
            "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
            "set": r.smembers,
        }[kind]
        shown[key.decode()] = (kind, reader(key))
    return shown


def test_a_heartbeat_is_alive_with_its_record_stamped_by_redis(store: RunStore) -> None:
    before = store.health.redis_now()
    written = store.health.heartbeat("worker", beat(), ttl_s=5)
    after = store.health.redis_now()
    assert before <= written.at <= after
    assert written.started == written.at
    reading = store.health.read_health(QUEUES, TASKS)
    (seen,) = reading.workers
    assert seen.name == "w1@h"
    assert seen.heartbeat == written
    assert seen.last_seen == pytest.approx(written.at)
    assert reading.beats == ()
    ttl = store.client.pttl(store.keys.heartbeat("worker", "w1@h"))
    assert 0 < ttl <= 5000  # type: ignore[operator]


def test_started_is_kept_from_the_first_heartbeat(store: RunStore) -> None:
    first = store.health.heartbeat("beat", beat("beat@h", ()), ttl_s=5)
    time.sleep(0.01)
    second = store.health.heartbeat("beat", first.model_copy(update={"pid": 43}), ttl_s=5)
    assert second.started == first.started
    assert second.at > first.at
    (seen,) = store.health.read_health(QUEUES, TASKS).beats
    assert seen.heartbeat is not None
    assert seen.heartbeat.pid == 43


def test_a_heartbeat_lapses_after_its_time_to_live(store: RunStore) -> None:
    written = store.health.heartbeat("worker", beat(), ttl_s=0.2)
    time.sleep(0.5)
    (seen,) = store.health.read_health(QUEUES, TASKS).workers
    assert seen.heartbeat is None
    assert seen.last_seen == pytest.approx(written.at)


def test_ending_a_heartbeat_forgets_the_process(store: RunStore) -> None:
    store.health.heartbeat("worker", beat("a@h"), ttl_s=5)
    store.health.heartbeat("worker", beat("b@h"), ttl_s=5)
    store.health.end_heartbeat("worker", "a@h")
    assert [w.name for w in store.health.read_health(QUEUES, TASKS).workers] == ["b@h"]
    assert not store.client.exists(store.keys.heartbeat("worker", "a@h"))


def test_processes_are_listed_latest_first_and_the_long_gone_forgotten(store: RunStore) -> None:
    now = store.health.redis_now()
    seen = store.keys.heartbeats("worker")
    store.client.zadd(seen, {"ancient@h": now - HEARTBEAT_KEPT_S - 10, "recent@h": now - 5})
    store.health.heartbeat("worker", beat("live@h"), ttl_s=5)
    names = [w.name for w in store.health.read_health(QUEUES, TASKS).workers]
    assert names == ["live@h", "recent@h"]


def test_roles_are_apart(store: RunStore) -> None:
    store.health.heartbeat("beat", beat("x", ()), ttl_s=5)
    reading = store.health.read_health(QUEUES, TASKS)
    assert reading.workers == ()
    assert [b.name for b in reading.beats] == ["x"]


def test_an_unreadable_or_foreign_heartbeat_reads_as_lapsed(store: RunStore) -> None:
    for name, raw in (("junk@h", "{not json"), ("other@h", beat("w9@h").model_dump_json())):
        store.client.set(store.keys.heartbeat("worker", name), raw)
        store.client.zadd(store.keys.heartbeats("worker"), {name: store.health.redis_now()})
    assert [w.heartbeat for w in store.health.read_health(QUEUES, TASKS).workers] == [None, None]


def test_a_huge_heartbeat_is_read_bounded(store: RunStore) -> None:
    name = "big@h"
    store.client.set(store.keys.heartbeat("worker", name), "x" * (HEARTBEAT_BYTES * 10))
    store.client.zadd(store.keys.heartbeats("worker"), {name: store.health.redis_now()})
    (seen,) = store.health.read_health(QUEUES, TASKS).workers
    assert seen.heartbeat is None


def test_a_bad_role_or_time_to_live_is_refused(store: RunStore) -> None:
    with pytest.raises(ValueError, match="role"):
        store.health.heartbeat("flower", beat(), ttl_s=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="time to live"):
        store.health.heartbeat("worker", beat(), ttl_s=0)


def test_ticks_record_when_each_task_last_ran(store: RunStore) -> None:
    first = store.health.record_tick("runwarden.reconcile")
    time.sleep(0.01)
    second = store.health.record_tick("runwarden.reconcile")
    assert second > first
    reading = store.health.read_health(QUEUES, TASKS)
    assert reading.ticks == {"runwarden.reconcile": second}
    assert store.health.read_health(QUEUES, ()).ticks == {}


def test_an_unreadable_tick_reads_as_never_run(store: RunStore) -> None:
    store.client.hset(store.keys.ticks, mapping={"runwarden.reconcile": "soon", "x": "1"})
    store.client.hset(store.keys.ticks, "runwarden.follow_tick", "nan")
    assert store.health.read_health(QUEUES, TASKS).ticks == {}


def test_queue_depths_read_every_priority_list_of_the_broker(store: RunStore) -> None:
    r: Any = store.client
    r.rpush("runwarden", "m1", "m2")
    r.rpush("runwarden\x06\x166", "m3")
    r.rpush("runwarden.retrieve\x06\x169", "m4")
    r.rpush("runwarden\x06\x165", "not a step")
    r.hset("unacked", mapping={"t1": "{}", "t2": "{}", "t3": "{}"})
    reading = store.health.read_health(QUEUES, TASKS)
    assert reading.queues == {
        "runwarden": {0: 2, 3: 0, 6: 1, 9: 0},
        "runwarden.retrieve": {0: 0, 3: 0, 6: 0, 9: 1},
    }
    assert reading.unacked == 3


def test_the_deadline_table_pending_overdue_and_next(store: RunStore) -> None:
    now = store.health.redis_now()
    reading = store.health.read_health(QUEUES, TASKS)
    assert (reading.deadlines.pending, reading.deadlines.overdue) == (0, 0)
    assert reading.deadlines.next is None
    for run_id, age in (("r1", 100.0), ("r2", -1000.0)):
        running(store, run_id)
        asked = datetime.fromtimestamp(now - age, UTC)
        store.stops.open(run_id, SnapshotReason.REQUESTED, "api", asked, proof_timeout_s=50)
    reading = store.health.read_health(QUEUES, TASKS)
    assert (reading.deadlines.pending, reading.deadlines.overdue) == (2, 1)
    first = reading.deadlines.next
    assert first is not None
    assert (first.run_id, first.kind) == ("r1", "proof")
    assert first.due.timestamp() == pytest.approx(now - 50, abs=1e-3)


def test_the_reading_writes_nothing_not_even_to_drop_a_malformed_deadline(
    store: RunStore,
) -> None:
    store.client.zadd(store.keys.deadlines, {"not|a deadline": 1.0})
    store.health.heartbeat("worker", beat(), ttl_s=60)
    store.health.record_tick("runwarden.reconcile")
    before = dump(store)
    reading = store.health.read_health(QUEUES, TASKS)
    assert dump(store) == before
    assert reading.deadlines.pending == 1
    assert reading.deadlines.next is None


def test_memory_is_read_where_redis_reports_it(
    store: RunStore, request: pytest.FixtureRequest
) -> None:
    reading = store.health.read_health(QUEUES, TASKS)
    if "fake" in request.node.callspec.id:
        # fakeredis has no INFO: read as a Redis whose ACL refuses it.
        assert (reading.used_memory, reading.maxmemory) == (None, None)
    else:
        assert reading.used_memory is not None
        assert reading.used_memory > 0
        assert reading.maxmemory is not None
        assert reading.maxmemory >= 0


def test_the_clock_is_redis_s(store: RunStore) -> None:
    assert abs(store.health.redis_now() - time.time()) < 5  # the same machine here
    now = store.health.redis_now()
    assert store.health.read_health(QUEUES, TASKS).now == pytest.approx(now, abs=2)
