"""`store.servers.data_servers`: the primary alone for a plain client; behind Sentinel
(a stub of redis-py's sentinel pool here: the real one is
tests/integration/service/test_sentinel.py's) each replica a sentinel sees up, as a
client of its own with the primary's credentials, and the others with the reason."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from schemas import StoreError
from store.servers import REPLICA_TIMEOUT_S, Unreachable, data_servers


def test_a_plain_client_is_the_primary_alone(redis_client: redis.Redis) -> None:
    found = data_servers(redis_client)
    assert found.primary.client is redis_client
    assert found.primary.role == "primary"
    assert (found.replicas, found.unreachable) == ((), ())


def replica(port: int, *flags: str) -> dict[str, Any]:
    """A `SENTINEL REPLICAS` entry as redis-py parses it."""
    return {"ip": "127.0.0.1", "port": port, "is_sdown": "s_down" in flags,
            "is_odown": "o_down" in flags, "is_disconnected": "disconnected" in flags}  # fmt: skip


class StubSentinel:
    def __init__(self, answer: list[dict[str, Any]] | Exception) -> None:
        self.answer = answer

    def sentinel_slaves(self, service: str) -> list[dict[str, Any]]:
        assert service == "runwarden"
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class StubPool:
    """What `data_servers` reads of redis-py's `SentinelConnectionPool`."""

    service_name = "runwarden"
    connection_class = redis.Connection

    def __init__(self, *sentinels: StubSentinel, master: Exception | None = None) -> None:
        self.sentinel_manager = type("Manager", (), {"sentinels": list(sentinels)})()
        self.connection_kwargs = {"username": "ops", "password": "pw", "db": 3}
        self.master = master

    def get_master_address(self) -> tuple[str, int]:
        if self.master is not None:
            raise self.master
        return "127.0.0.1", 7000


class StubClient:
    def __init__(self, pool: StubPool) -> None:
        self.connection_pool = pool


def test_behind_sentinel_every_replica_a_sentinel_sees_up_and_the_others_why() -> None:
    refused = RedisConnectionError("Error 111 connecting")
    pool = StubPool(
        StubSentinel(refused),
        StubSentinel([replica(7001), replica(7002, "s_down", "disconnected"),
                      replica(7003, "s_down")]),
        # A sentinel that sees 7003 up wins; the primary is never its own replica.
        StubSentinel([replica(7003), replica(7000)]),
    )  # fmt: skip
    found = data_servers(StubClient(pool))
    try:
        assert found.primary.address == "127.0.0.1:7000"
        assert [r.address for r in found.replicas] == ["127.0.0.1:7001", "127.0.0.1:7003"]
        assert found.unreachable == (
            Unreachable("127.0.0.1:7002", "the sentinels see it down (s_down,disconnected)"),
        )
        kwargs = found.replicas[0].client.connection_pool.connection_kwargs
        assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("ops", "pw", 3)
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == REPLICA_TIMEOUT_S
    finally:
        found.close()


def test_no_sentinel_answering_is_one_entry_for_the_replicas() -> None:
    pool = StubPool(StubSentinel(RedisConnectionError("timed out")))
    found = data_servers(StubClient(pool))
    assert found.replicas == ()
    [entry] = found.unreachable
    assert entry.address == "replicas of runwarden"
    assert "SENTINEL REPLICAS runwarden" in entry.reason
    assert "timed out" in entry.reason


def test_no_primary_named_is_a_store_error() -> None:
    pool = StubPool(master=RedisConnectionError("No master found for 'runwarden'"))
    with pytest.raises(StoreError, match="no sentinel names the primary"):
        data_servers(StubClient(pool))
