"""`store.acl` against a real redis-server: users saved to the server's ACL file when
it has one, and said not to be when it has none (then they last until it restarts)."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from bench.harness.redis_server import RedisServer, running_redis
from store.acl import WORKER_USER, save_users, set_producer_user, set_worker_user


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
