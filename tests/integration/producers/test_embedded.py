"""`producers.embedded.EmbeddedRedis`: the private Redis of `runwarden serve` runs with
`RUNWARDEN_REDIS_MAXMEMORY` as its `maxmemory` and `noeviction` (read back with
`CONFIG GET` from the real server it starts), and the store reads that limit."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from producers.embedded import EmbeddedRedis
from schemas import Settings
from store import RunStore


@pytest.mark.parametrize(("given", "expected"), [("64mb", 64 * 1024**2), ("100000000", 10**8)])
def test_the_embedded_server_has_the_maxmemory_of_the_settings(
    tmp_path: Path, given: str, expected: int
) -> None:
    settings = Settings(state_dir=tmp_path / "state", redis_maxmemory=given)  # type: ignore[arg-type]
    server = EmbeddedRedis(settings)
    server.start()
    try:
        client = redis.Redis(unix_socket_path=str(settings.embedded_socket), socket_timeout=5)
        assert client.config_get("maxmemory") == {"maxmemory": str(expected)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        use = RunStore.from_settings(settings).memory()
        assert (use.max, use.policy, use.high) == (expected, "noeviction", False)
        client.close()
    finally:
        server.stop()


def test_the_default_is_two_gib(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    server = EmbeddedRedis(settings)
    server.start()
    try:
        client = redis.Redis(unix_socket_path=str(settings.embedded_socket), socket_timeout=5)
        assert client.config_get("maxmemory") == {"maxmemory": str(2 * 1024**3)}
        client.close()
    finally:
        server.stop()
