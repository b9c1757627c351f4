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
