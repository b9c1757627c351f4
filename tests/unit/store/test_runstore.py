"""`store.runstore`: the whole `RunStore` over a client that decodes its replies."""

from __future__ import annotations

from datetime import timedelta

import redis

from schemas import Progress
from schemas.snapshot import SnapshotReason
from store import RunStore

from .conftest import T0, running


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
    store.targets.put("t", {"kind": "local", "workdir": "/w"})
    assert list(store.targets.all()) == ["t"]
    store.follow.add("r1")
    assert store.follow.runs("local") == ["r1"]
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "cli", T0, 30)
    assert store.stops.get("r1") == stop
    assert [d.run_id for d in store.stops.due_deadlines(T0 + timedelta(hours=1))] == ["r1"]
    store.follow.append_log("r1", ["a"])
    store.follow.append_metrics("r1", [{"event": "begin", "max_steps": 3}])
    assert [e.line for e in store.follow.read_log("r1")] == ["a"]
    assert store.follow.last_metrics("r1") == Progress(max_steps=3)
    assert store.stops.close("r1") is not None
    decoding.close()
