"""The run store's client behind Sentinel (`store.runstore._sentinel_client`), without
a sentinel: how the primary is looked for, and what is said when no sentinel names
one (the real sentinels: tests/integration/service/test_sentinel.py)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import MasterNotFoundError

from schemas.sentinel import parse_sentinel
from store import RunStore
from store.runstore import _Sentinel, _sentinel_client

UP = {"ip": "10.0.0.9", "port": 6379, "flags": "master", "is_master": True,
      "is_sdown": False, "is_odown": False, "num-other-sentinels": 2}  # fmt: skip


class StubSentinel:
    """A sentinel at `port` answering `SENTINEL MASTERS` with `masters`, or raising it."""

    def __init__(self, port: int, masters: dict[str, Any] | Exception) -> None:
        self.port, self.masters, self.asked = port, masters, 0

    def get_connection_kwargs(self) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": self.port}

    def sentinel_masters(self) -> dict[str, Any]:
        self.asked += 1
        if isinstance(self.masters, Exception):
            raise self.masters
        return self.masters


def manager(*stubs: StubSentinel) -> _Sentinel:
    sentinel = _Sentinel([("127.0.0.1", s.port) for s in stubs])  # type: ignore[no-untyped-call]
    sentinel.sentinels = list(stubs)
    return sentinel


def test_the_first_sentinel_naming_the_primary_up_is_asked_first_next_time() -> None:
    down = StubSentinel(1, RedisConnectionError("Error 111 connecting. Connection refused."))
    sdown = StubSentinel(2, {"rw": {**UP, "is_sdown": True, "flags": "master,s_down"}})
    good = StubSentinel(3, {"rw": UP})
    sentinel = manager(down, sdown, good)
    assert sentinel.discover_master("rw") == ("10.0.0.9", 6379)
    assert [s.asked for s in (down, sdown, good)] == [1, 1, 1]  # each asked once, in turn
    assert sentinel.sentinels[0] is good


def test_no_primary_named_says_what_each_sentinel_said_in_one_line() -> None:
    sentinel = manager(
        StubSentinel(1, RedisConnectionError("Error 111 connecting\n to 127.0.0.1:1.")),
        StubSentinel(2, RedisTimeoutError("Timeout reading from socket")),
        StubSentinel(3, InvalidResponse("Protocol Error: b'HTTP/1.1 400 Bad Request'")),
        StubSentinel(4, {"other": UP}),
        StubSentinel(5, {"rw": {**UP, "is_odown": True, "flags": "master,o_down"}}),
    )
    with pytest.raises(MasterNotFoundError) as raised:
        sentinel.discover_master("rw")
    assert str(raised.value) == (
        "no sentinel names a primary for 'rw': "
        "127.0.0.1:1 unreachable (Error 111 connecting to 127.0.0.1:1.); "
        "127.0.0.1:2 unreachable (Timeout reading from socket); "
        "127.0.0.1:3 answered no sentinel's reply "
        "(Protocol Error: b'HTTP/1.1 400 Bad Request'); "
        "127.0.0.1:4 monitors no master 'rw'; "
        "127.0.0.1:5 sees 'rw' down (master,o_down)"
    )
    assert isinstance(raised.value, RedisConnectionError)  # the store's StoreError


@pytest.mark.parametrize("timeout_s", [None, 0.5])
def test_a_sentinel_is_asked_once_per_lookup_the_primarys_retry_is_the_only_one(
    timeout_s: float | None,
) -> None:
    """A sentinel that is down costs one failed connect per lookup, never a retry with
    backoff of its own (redis-py's default: 3, seconds apart)."""
    store = RunStore.from_url("sentinel://127.0.0.1:1,127.0.0.1:2/rw", timeout_s=timeout_s)
    pool: Any = store.client.connection_pool
    for sentinel in pool.sentinel_manager.sentinels:
        retry = sentinel.get_connection_kwargs()["retry"]
        assert retry.get_retries() == 0
    wait = sentinel.get_connection_kwargs()["socket_connect_timeout"]
    assert wait == (2 if timeout_s is None else timeout_s)
    store.client.close()


def test_the_sentinels_password_is_theirs_and_the_servers_the_servers() -> None:
    url = "sentinel://u:pw@127.0.0.1:1/rw?db=3&sentinel_password=spw"
    bounded = {"socket_timeout": 5.0, "socket_connect_timeout": 1.0}
    client: Any = _sentinel_client(parse_sentinel(url), bounded)
    sentinel = client.connection_pool.sentinel_manager.sentinels[0]
    assert sentinel.get_connection_kwargs()["password"] == "spw"
    assert sentinel.get_connection_kwargs()["socket_timeout"] == 2.0  # at most 2 s a reply
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("u", "pw", 3)
    client.close()
