"""`store.acl` against a real redis-server: users saved to the server's ACL file when
it has one, and said not to be when it has none (then they last until it restarts); the
web view's user, with its selectors, the same after a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from bench.harness.redis_server import RedisServer, running_redis
from store.acl import (
    WEB_USER,
    WORKER_USER,
    save_users,
    set_producer_user,
    set_web_user,
    set_worker_user,
)


def test_users_are_saved_where_the_server_has_an_acl_file(tmp_path: Path) -> None:
    with running_redis(tmp_path / "plain") as plain:
        client = plain.client()
        set_producer_user(client, "billing", SecretStr("pw"))
        assert save_users(client) is False  # no ACL file: until it restarts
        client.close()
    server = RedisServer(tmp_path / "with-file", acl_file=True)
    server.start()
    try:
        client = server.client()
        set_worker_user(client, SecretStr("pw"))
        assert save_users(client) is True
        client.close()
        assert server.acl_path is not None
        assert f"user {WORKER_USER} " in server.acl_path.read_text()
        server.restart()
        client = server.client()
        assert WORKER_USER.encode() in client.execute_command("ACL", "USERS")
        client.close()
    finally:
        server.stop()


def test_the_web_user_outlives_a_restart_with_its_selectors(tmp_path: Path) -> None:
    """The web view's user (`web_rules`: ACL selectors, and key patterns holding kombu's
    priority separator, bytes 0x06 0x16) saved to the ACL file and loaded back by a
    restart: the same rules (Redis lists a rule's commands in an order of its own), and
    what they allow and refuse still holds."""
    server = RedisServer(tmp_path / "with-file", acl_file=True)
    server.start()
    try:
        client = server.client()
        set_web_user(client, SecretStr("web-pw"))
        assert save_users(client) is True
        before = _rules(client.execute_command("ACL", "GETUSER", WEB_USER))
        client.close()
        server.restart()
        client = server.client()
        assert _rules(client.execute_command("ACL", "GETUSER", WEB_USER)) == before
        client.close()
        web = server.client(username=WEB_USER, password="web-pw")
        assert web.lpush("runwarden\x06\x163", "{}") == 1
        assert web.llen("runwarden.watch\x06\x169") == 0
        with pytest.raises(redis.exceptions.NoPermissionError):
            web.lpush("runwarden.watch\x06\x163", "{}")
        with pytest.raises(redis.exceptions.NoPermissionError):
            web.set("rw:run:r1", "{}")
        web.close()
    finally:
        server.stop()


def _rules(user: dict[bytes, Any]) -> list[tuple[Any, ...]]:
    """`ACL GETUSER`'s answer as comparable rules: per part (the user, each selector),
    its keys, its channels and the set of its commands."""
    parts = [user, *user[b"selectors"]]
    return [(p[b"keys"], p[b"channels"], frozenset(p[b"commands"].split())) for p in parts]
