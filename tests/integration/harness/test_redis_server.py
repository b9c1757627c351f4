"""Self-test of the redis-server fixture (`bench/harness/redis_server.py`): durable, as the
store's tests over it assume."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from bench.harness.redis_server import RedisServer


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the session's real redis-server (tests/conftest.py)."""
    client = redis_server.client()
    yield client
    client.close()


def test_server_runs_with_aof(redis_client: redis.Redis) -> None:
    config: Any = redis_client.config_get("append*")
    assert config["appendonly"] == "yes"
    assert config["appendfsync"] == "always"
