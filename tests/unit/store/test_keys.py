"""`store.keys`: every key under the store's prefix."""

from __future__ import annotations

import pytest
import redis

from schemas.errors import NotFound
from store import RunStore

from .conftest import record


def test_prefix_isolates_stores(redis_client: redis.Redis) -> None:
    a, b = RunStore(redis_client, prefix="a:"), RunStore(redis_client, prefix="b:")
    a.runs.create(record("r1"))
    assert b.runs.find() == []
    with pytest.raises(NotFound):
        b.runs.get("r1")
