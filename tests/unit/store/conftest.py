"""The run store's tests (the `store` package) run over fake and real Redis: every
test gets its Redis from `redis_client`, parametrized over a fakeredis server and the
session's real redis-server. So a test here must use only `redis_client` / `store`
(and `make_store` for other caps), never fakeredis directly. What needs a real
server of its own (AOF restart, a server that is down) is in
tests/integration/store/."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest
import redis

from bench.harness.redis_server import RedisServer
from schemas.job import JobId
from schemas.run import RunRecord, RunState
from schemas.snapshot import Snapshot, SnapshotReason
from store import RunStore

T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
JOB = JobId(dir="/work/r1", pid=4242)
SNAP = Snapshot(checkpoint="output/checkpoint-40", step=40, reason=SnapshotReason.REQUESTED)


@pytest.fixture(params=["fake", "real"])
def redis_client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """An empty Redis, each test run twice: `fake`, a private fakeredis server (its Lua
    scripts run by `lupa`), and `real`, the session's real redis-server
    (tests/conftest.py, `redis_server`), emptied first."""
    client: redis.Redis
    if request.param == "fake":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        client = server.client()
        client.flushall()
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
    assert store.runs.create(record(run_id, **fields))
    return store.runs.transition(run_id, RunState.RUNNING, job=JOB, expect={RunState.PREPARING})


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
