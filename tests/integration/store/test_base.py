"""The run store against a real `redis-server` of each test's own (AOF on, unix
socket), for what needs a real server: data surviving a restart (AOF; the Lua
scripts loaded again, `store.base`), and a server that is down or hangs giving
`StoreError` quickly (the translation at `store.base`'s edge). The store's
contract runs over fake and real Redis in tests/unit/store/.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from bench.harness.redis_server import RedisServer, running_redis
from schemas.errors import StoreError
from schemas.run import RunState
from schemas.snapshot import SnapshotReason
from schemas.stops import StopPhase
from store import RunStore

from ...unit.store.conftest import T0, running


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone, which it may restart, kill or stop."""
    with running_redis(tmp_path / "redis") as server:
        yield server


@pytest.mark.parametrize("how", ["restart", "kill"])
def test_data_survives_a_restart(own_server: RedisServer, how: str) -> None:
    client = own_server.client()
    store = RunStore(client)
    store.targets.put("local", {"kind": "local", "workdir": "/w"})
    running(store)
    store.follow.add("r1")
    store.follow.set_offsets("r1", 10, 20)
    stop, _ = store.stops.open("r1", SnapshotReason.COST, "policy:cost", T0, 30)
    end = T0 + timedelta(minutes=10)
    store.stops.advance(
        "r1", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.WAITING_END, end_deadline=end
    )
    store.follow.append_log("r1", ["a", "b"])
    store.follow.append_metrics("r1", [{"event": "begin", "max_steps": 7}])
    before = (
        store.runs.get("r1"),
        store.stops.get("r1"),
        store.stops.pending_deadlines(),
        store.follow.read_log("r1"),
        store.follow.last_metrics("r1"),
    )

    if how == "restart":
        own_server.restart()
    else:
        own_server.kill()  # fsync per write: nothing acknowledged is lost
        own_server.start()

    # The same client and store carry on: a broken pooled connection is replaced, and
    # the Lua scripts, gone from the server's cache, are loaded again.
    after = (
        store.runs.get("r1"),
        store.stops.get("r1"),
        store.stops.pending_deadlines(),
        store.follow.read_log("r1"),
        store.follow.last_metrics("r1"),
    )
    assert after == before
    assert store.targets.get("local") == {"kind": "local", "workdir": "/w"}
    assert store.follow.runs("local") == ["r1"]
    assert store.follow.offsets("r1") == (10, 20)
    closed = store.stops.close("r1", stop.stop_id, "done")
    assert closed is not None
    assert store.stops.pending_deadlines() == []
    assert store.runs.transition("r1", RunState.STOPPED).state is RunState.STOPPED
    client.close()


def test_store_error_when_the_server_is_down(own_server: RedisServer) -> None:
    client = own_server.client(socket_timeout=1.0)
    store = RunStore(client)
    running(store)
    own_server.terminate()
    calls = [
        lambda: store.runs.get("r1"),
        lambda: store.runs.transition("r1", RunState.CANCELLED),
        lambda: store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30),
        lambda: store.stops.due_deadlines(T0),
        lambda: store.follow.append_log("r1", ["x"]),
        lambda: store.locks.once("k", 10),
        store.ping,
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(StoreError, match="cannot reach Redis") as info:
            call()
        assert time.monotonic() - started < 2.0
        assert isinstance(info.value.__cause__, redis.ConnectionError)
    own_server.start()
    assert store.runs.get("r1").state is RunState.RUNNING
    client.close()


def test_store_error_when_the_server_hangs(own_server: RedisServer) -> None:
    import os
    import signal

    client = own_server.client(socket_timeout=0.5, retries=0)
    store = RunStore(client)
    store.ping()
    assert own_server.pid is not None
    os.kill(own_server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match="did not answer in time"):
            store.stops.get("r1")
        assert time.monotonic() - started < 2.0
    finally:
        os.kill(own_server.pid, signal.SIGCONT)
    client.close()
