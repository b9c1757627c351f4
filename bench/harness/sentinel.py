"""Redis behind Sentinel for the tests: a primary, a replica and three `redis-sentinel`
processes on loopback, each on a free port, all real processes.

- The data servers ([`TcpRedisServer`]) run as [`redis_server.RedisServer`] does (AOF
  with an fsync per write, their own directory), on a TCP port of 127.0.0.1 too,
  from a configuration file (the sentinels rewrite it after a failover), their users
  in an ACL file: `default` (the operator's, `redis-password`), the workers' `worker`,
  `sentinel` (what the sentinels log in as) and `replica` (what a replica syncs as:
  `masteruser`), the same on both, since either may be the primary.
- The sentinels ([`SentinelNode`]) watch the primary under [`MASTER_NAME`], quorum 2,
  with a password of their own (`requirepass`, `redis-sentinel-password`), and act
  fast: the primary is down after `down_after_ms` (1 s) and a failover times out
  after `failover_timeout_ms` (3 s).

[`SentinelCluster.kill_primary`] is `kill -9` of the primary; [`wait_failover`] waits
until every sentinel names another one; [`restart`] starts a killed server again on
its directory and port (the sentinels make it a replica of the new primary).

Every process dies with the thread that started it (`PR_SET_PDEATHSIG`), as the
single server does.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Final

import redis
from pydantic import SecretStr

from store.acl import (
    REPLICA_USER,
    SENTINEL_USER,
    WORKER_USER,
    replica_rules,
    sentinel_rules,
    worker_rules,
)

from .ports import free_port
from .redis_server import REDIS_SERVER, RedisServer, _die_with_parent

__all__ = ["MASTER_NAME", "SentinelCluster", "SentinelNode", "TcpRedisServer"]

MASTER_NAME: Final = "runwarden"
HOST: Final = "127.0.0.1"
REDIS_SENTINEL = shutil.which("redis-sentinel")
"""Debian's `redis-sentinel` (the Makefile installs it); without it, `redis-server
--sentinel`, the same program."""


def _admin_rules(password: SecretStr) -> list[str]:
    digest = hashlib.sha256(password.get_secret_value().encode()).hexdigest()
    return ["reset", "on", f"#{digest}", "~*", "&*", "+@all"]


class TcpRedisServer(RedisServer):
    """A [`RedisServer`] also on `127.0.0.1:port`, from a configuration file of its
    own (`redis.conf` in its directory, which `CONFIG REWRITE` may change), with
    `password` for its `default` user in its ACL file (the probe logs in with it)."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        *,
        password: SecretStr,
        users: str,
        replica_password: SecretStr,
        replica_of: int | None = None,
    ) -> None:
        super().__init__(data_dir, acl_file=True)
        self.port = port
        self.password = password
        assert self.acl_path is not None
        self.acl_path.write_text(users)
        self.conf_path = self.data_dir / "redis.conf"
        lines = [
            f"masteruser {REPLICA_USER}",
            f'masterauth "{replica_password.get_secret_value()}"',
            "repl-diskless-sync yes",
            "repl-diskless-sync-delay 0",
            "repl-ping-replica-period 1",
        ]
        if replica_of is not None:
            lines.append(f"replicaof {HOST} {replica_of}")
        self.conf_path.write_text("\n".join(lines) + "\n")

    def argv(self) -> list[str]:
        base = super().argv()
        at = base.index("--port")
        return [base[0], str(self.conf_path), *base[1:at], "--port", str(self.port),
                "--bind", HOST, *base[at + 2:]]  # fmt: skip

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client of this server as its `default` user (over its unix socket)."""
        return super().client(password=self.password.get_secret_value(), **kwargs)

    def role(self) -> str:
        """`master` or `slave`, as the server says now."""
        client = self.client(socket_timeout=1.0, retries=0)
        try:
            info: dict[str, Any] = client.info("replication")
            return str(info["role"])
        finally:
            client.close()


class SentinelNode:
    """One `redis-sentinel` on `127.0.0.1:port`, watching the primary at
    `primary_port` as [`MASTER_NAME`]."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        primary_port: int,
        *,
        password: SecretStr,
        auth_password: SecretStr,
        down_after_ms: int,
        failover_timeout_ms: int,
    ) -> None:
        self.data_dir = data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.password = password
        self.conf_path = data_dir / "sentinel.conf"
        self.log_path = data_dir / "sentinel.log"
        secret = password.get_secret_value()
        self.conf_path.write_text(
            "\n".join([
                f"port {port}",
                f"bind {HOST}",
                "daemonize no",
                f"dir {data_dir}",
                f"logfile {self.log_path}",
                f'requirepass "{secret}"',
                f'sentinel sentinel-pass "{secret}"',
                f"sentinel monitor {MASTER_NAME} {HOST} {primary_port} 2",
                f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}",
                f"sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}",
                f"sentinel parallel-syncs {MASTER_NAME} 1",
                f"sentinel auth-user {MASTER_NAME} {SENTINEL_USER}",
                f'sentinel auth-pass {MASTER_NAME} "{auth_password.get_secret_value()}"',
            ]) + "\n"
        )  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        if REDIS_SENTINEL is not None:
            return [REDIS_SENTINEL, str(self.conf_path)]
        return [REDIS_SERVER, str(self.conf_path), "--sentinel"]

    def start(self, timeout_s: float = 10.0) -> None:
        self.process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-sentinel exited: {self.log_tail()}")
            with contextlib.suppress(redis.RedisError):
                if self.client().ping():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-sentinel did not answer: {self.log_tail()}")
            time.sleep(0.02)

    def client(self) -> redis.Redis:
        return redis.Redis(
            host=HOST,
            port=self.port,
            password=self.password.get_secret_value(),
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
        )

    def master(self) -> dict[str, Any]:
        """`SENTINEL MASTER` of [`MASTER_NAME`] as this sentinel sees it."""
        client = self.client()
        try:
            found: Any = client.sentinel_master(MASTER_NAME)
            return dict(found)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, size: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"


class SentinelCluster:
    """A primary, a replica and three sentinels (see the module docstring), the data
    servers' users made from the passwords given: `password` for `default`,
    `worker_password` for `worker`, `sentinel_password` for the sentinels' own
    `requirepass`; the `sentinel` and `replica` users' passwords are made here."""

    def __init__(
        self,
        base: Path,
        *,
        password: SecretStr,
        sentinel_password: SecretStr,
        worker_password: SecretStr,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.base = base
        self.password = password
        self.sentinel_password = sentinel_password
        auth = SecretStr(secrets.token_hex(16))
        replica = SecretStr(secrets.token_hex(16))
        # An ACL file takes each rule as a bare word (these have no space).
        users = "".join(
            " ".join(["user", name, *rules]) + "\n"
            for name, rules in (
                ("default", _admin_rules(password)),
                (WORKER_USER, worker_rules(worker_password)),
                (SENTINEL_USER, sentinel_rules(auth)),
                (REPLICA_USER, replica_rules(replica)),
            )
        )
        primary_port, replica_port = free_port(), free_port()
        common: dict[str, Any] = {"password": password, "users": users, "replica_password": replica}
        self.servers = [
            TcpRedisServer(base / "primary", primary_port, **common),
            TcpRedisServer(base / "replica", replica_port, replica_of=primary_port, **common),
        ]
        self.sentinels = [
            SentinelNode(
                base / f"sentinel-{i}",
                free_port(),
                primary_port,
                password=sentinel_password,
                auth_password=auth,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for i in range(3)
        ]

    @property
    def url(self) -> str:
        """`RUNWARDEN_REDIS_URL` for this set: no password (the secrets directory's)."""
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"sentinel://{hosts}/{MASTER_NAME}"

    def start(self, timeout_s: float = 30.0) -> None:
        """Starts the servers, then the sentinels; returns once the replica is in sync
        and every sentinel knows the primary, its replica and the two other
        sentinels."""
        for server in self.servers:
            server.start()
        for sentinel in self.sentinels:
            sentinel.start()
        deadline = time.monotonic() + timeout_s
        while not self._settled():
            if time.monotonic() > deadline:
                raise RuntimeError("the Sentinel set did not settle: " + self.logs())
            time.sleep(0.1)

    def _settled(self) -> bool:
        with contextlib.suppress(redis.RedisError, KeyError):
            info = self.servers[1].client(retries=0).info("replication")
            if info.get("master_link_status") != "up":
                return False
            for sentinel in self.sentinels:
                seen = sentinel.master()
                if int(seen["num-slaves"]) < 1 or int(seen["num-other-sentinels"]) < 2:
                    return False
            return True
        return False

    def primary_port(self) -> int | None:
        """The primary's port as the sentinels agree on it (None while they differ or
        cannot be asked)."""
        ports = set()
        for sentinel in self.sentinels:
            try:
                client = sentinel.client()
                try:
                    address: Any = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                finally:
                    client.close()
            except redis.RedisError:
                return None
            if not address:
                return None
            ports.add(int(address[1]))
        return ports.pop() if len(ports) == 1 else None

    def server_at(self, port: int) -> TcpRedisServer:
        return next(s for s in self.servers if s.port == port)

    def primary(self) -> TcpRedisServer:
        port = self.primary_port()
        if port is None:
            raise RuntimeError("the sentinels do not agree on a primary")
        return self.server_at(port)

    def kill_primary(self) -> TcpRedisServer:
        """SIGKILLs the primary (`kill -9`); returns it."""
        primary = self.primary()
        primary.kill()
        return primary

    def wait_failover(self, old_port: int, timeout_s: float = 30.0) -> TcpRedisServer:
        """Waits until every sentinel names a primary other than `old_port`'s, and it
        says it is one; returns it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old_port:
                with contextlib.suppress(redis.RedisError):
                    if self.server_at(port).role() == "master":
                        return self.server_at(port)
            time.sleep(0.05)
        raise RuntimeError("no failover: " + self.logs())

    def wait_replicas(
        self, primary: TcpRedisServer, count: int = 1, timeout_s: float = 30.0
    ) -> None:
        """Waits until `primary` has `count` replicas online."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                info = primary.client(retries=0).info("replication")
                online = sum(
                    1 for k, v in info.items()
                    if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
                )  # fmt: skip
                if online >= count:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"the primary has no {count} replica(s) online: " + self.logs())

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()

    def logs(self) -> str:
        parts = [f"--- {s.data_dir.name}\n{s.log_tail()}" for s in self.servers]
        parts += [f"--- {s.data_dir.name}\n{s.log_tail()}" for s in self.sentinels]
        return "\n".join(parts)
