"""The data servers of the store's Redis that a change of users goes to: Redis does not
replicate ACL users, so a user must be written on the primary and on each replica
(any replica may be the primary after a failover).

[`data_servers`] lists them from the store's client (`RunStore.client`):

- the primary: the client itself (for a `sentinel://` URL, redis-py's
  `Sentinel.master_for` client, which asks the sentinels where the primary is);
- behind Sentinel, every replica any sentinel lists for the master (`SENTINEL
  REPLICAS <name>`, asked of each sentinel), each as a client of its own with the
  primary connection's user, password and database, and 2 s connect and reply
  timeouts without a retry ([`REPLICA_TIMEOUT_S`]);
- the replicas that every sentinel listing them flags down or disconnected
  (`s_down`, `o_down`, `disconnected`), and, when no sentinel answers, the replicas
  as a whole, as [`Unreachable`] entries with the reason: the caller reports them, it
  cannot write there now.

For a plain URL (`redis://`, `unix://`, the embedded server): the primary alone.
Only reads the sentinels; writes nothing. The caller closes the replicas' clients
([`DataServers.close`]); the primary's is the store's and stays open.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Final

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from schemas import StoreError

from .base import text

__all__ = ["REPLICA_TIMEOUT_S", "DataServer", "DataServers", "Unreachable", "data_servers"]

REPLICA_TIMEOUT_S: Final = 2.0
"""How long a replica's client waits to connect and for each reply."""
_DOWN_FLAGS: Final = (("is_sdown", "s_down"), ("is_odown", "o_down"),
                      ("is_disconnected", "disconnected"))  # fmt: skip
"""redis-py's booleans of a `SENTINEL REPLICAS` entry, and the sentinel's flags."""
_SSL_KEYS: Final = ("ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs",
                    "ssl_ca_path", "ssl_ca_data", "ssl_check_hostname")  # fmt: skip


@dataclass(frozen=True)
class DataServer:
    """One data server to write to: `address` (`host:port`, or a unix socket's path),
    whether it is the `primary`, and a redis-py `client` of it."""

    address: str
    primary: bool
    client: Any

    @property
    def role(self) -> str:
        return "primary" if self.primary else "replica"


@dataclass(frozen=True)
class Unreachable:
    """A replica that cannot be written now: its `address` (or `replicas of <master>`
    when no sentinel could list them) and the `reason`, for a person."""

    address: str
    reason: str


@dataclass(frozen=True)
class DataServers:
    """The primary, the replicas to write to, and those that cannot be."""

    primary: DataServer
    replicas: tuple[DataServer, ...] = ()
    unreachable: tuple[Unreachable, ...] = ()

    def close(self) -> None:
        """Closes the replicas' clients (never the primary's: the store's)."""
        for replica in self.replicas:
            with contextlib.suppress(RedisError):
                replica.client.close()


def data_servers(client: Any) -> DataServers:
    """The data servers behind `client`, the store's redis-py client (see the module
    docstring). A replica's trouble never raises: it is an [`Unreachable`] entry.

    Raises:
        StoreError: behind Sentinel, no sentinel names a primary (or none answers).
    """
    pool = client.connection_pool
    manager = getattr(pool, "sentinel_manager", None)
    service = getattr(pool, "service_name", None)
    if manager is None or service is None:
        return DataServers(DataServer(_plain_address(pool.connection_kwargs), True, client))
    try:
        host, port = pool.get_master_address()
    except RedisError as error:
        raise StoreError(
            f"run store: no sentinel names the primary of {service!r}: {error}"
        ) from error
    primary = DataServer(f"{host}:{port}", True, client)
    listed, unreachable = _listed_replicas(manager.sentinels, service, primary.address)
    replicas = tuple(
        DataServer(address, False, _replica_client(host, port, pool))
        for address, (host, port) in listed.items()
    )
    return DataServers(primary, replicas, unreachable)


def _plain_address(kwargs: dict[str, Any]) -> str:
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _listed_replicas(
    sentinels: list[Any], service: str, primary: str
) -> tuple[dict[str, tuple[str, int]], tuple[Unreachable, ...]]:
    """The replicas of `service` that some sentinel sees up (address -> host, port),
    and those every sentinel listing them sees down, or, when no sentinel answers,
    one entry for them all. The primary's own address is never a replica."""
    up: dict[str, tuple[str, int]] = {}
    down: dict[str, str] = {}
    errors: list[str] = []
    for sentinel in sentinels:
        try:
            entries: list[dict[str, Any]] = sentinel.sentinel_slaves(service)
        except RedisError as error:
            errors.append(str(error))
            continue
        for entry in entries:
            host, port = text(entry["ip"]), int(entry["port"])
            address = f"{host}:{port}"
            if address == primary:
                continue
            flags = [flag for key, flag in _DOWN_FLAGS if entry.get(key)]
            if flags:
                down.setdefault(address, ",".join(flags))
            else:
                up[address] = (host, port)
    if errors and len(errors) == len(sentinels):
        reason = f"no sentinel listed the replicas (SENTINEL REPLICAS {service}): {errors[-1]}"
        return {}, (Unreachable(f"replicas of {service}", reason),)
    missed = tuple(
        Unreachable(address, f"the sentinels see it down ({flags})")
        for address, flags in sorted(down.items())
        if address not in up
    )
    return dict(sorted(up.items())), missed


def _replica_client(host: str, port: int, pool: Any) -> redis.Redis:
    """A client of the replica at `host:port` with the primary connection's user,
    password and database (and TLS), bounded as [`REPLICA_TIMEOUT_S`] says."""
    kwargs = pool.connection_kwargs
    tls: dict[str, Any] = {}
    if issubclass(pool.connection_class, redis.SSLConnection):
        tls = {"ssl": True, **{k: kwargs[k] for k in _SSL_KEYS if k in kwargs}}
    return redis.Redis(
        host=host,
        port=port,
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        db=kwargs.get("db", 0),
        socket_timeout=REPLICA_TIMEOUT_S,
        socket_connect_timeout=REPLICA_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        **tls,
    )
