"""`RunStore.health.memory` against a real `redis-server` of the test's own (fakeredis has no
`INFO`): Redis's use against its `maxmemory`, and `high` above 80 % of it; at the
limit, with `noeviction`, Redis refuses writes and the store says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.redis_server import RedisServer, running_redis
from schemas import StoreError
from store import MEMORY_WARN_FRACTION, RunStore


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path / "redis") as server:
        yield server


def test_memory_reads_use_and_limit(own_server: RedisServer) -> None:
    client = own_server.client()
    store = RunStore(client)
    client.config_set("maxmemory", 0)
    free = store.health.memory()
    assert free.used > 0
    assert (free.max, free.fraction, free.high) == (None, None, False)

    used = store.health.memory().used
    limit = int(used / 0.9)  # about 90 % used once set
    client.config_set("maxmemory", limit)
    client.config_set("maxmemory-policy", "noeviction")
    near = store.health.memory()
    assert near.max == limit
    assert near.policy == "noeviction"
    assert near.fraction is not None
    assert near.fraction > MEMORY_WARN_FRACTION
    assert near.high

    client.config_set("maxmemory", used * 4)
    assert not store.health.memory().high


def test_at_the_limit_redis_refuses_writes_and_the_store_says_so(
    own_server: RedisServer,
) -> None:
    client = own_server.client()
    store = RunStore(client)
    client.config_set("maxmemory", store.health.memory().used + 256 * 1024)
    client.config_set("maxmemory-policy", "noeviction")
    def fill() -> None:
        for _ in range(1000):
            store.follow.append_log("r1", ["x" * 7000] * 50)

    with pytest.raises(StoreError, match="maxmemory"):
        fill()
    assert store.health.memory().high
