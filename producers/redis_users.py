"""A producer's Redis user (`store/acl.py`) made or deleted on every data server of the
service's Redis: Redis does not replicate ACL users, so behind Sentinel
(`store.servers`) the user goes to the primary and to each replica the sentinels
list, any of which may be the primary after a failover.

Guarantees and failure modes, for [`add_user`] and [`remove_user`]:

- the primary is written first (`ACL SETUSER` or `ACL DELUSER`, then `ACL SAVE`); its
  failure raises `StoreError` and nothing else is tried;
- each replica is then written the same way; a replica that refuses, cannot be
  reached in its 2 s, or that the sentinels see down is not fatal: it is reported
  in `missed`, with the reason, and the change is on the other servers. Adding again
  (`runwarden producers add NAME`: the same password, rules set anew) or removing
  again puts it there once the replica is back;
- a server without an ACL file keeps the change until it restarts (`saved` False
  for it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from schemas import StoreError
from schemas.text import error_line
from store.acl import delete_producer_user, producer_user, save_users, set_producer_user
from store.servers import DataServer, Unreachable, data_servers

__all__ = ["AddedUser", "RemovedUser", "ServerMissed", "ServerWritten", "add_user", "remove_user"]


@dataclass(frozen=True)
class ServerWritten:
    """A data server that took the change: its `address`, `role` (`primary` or
    `replica`), and whether it `saved` it to its ACL file (else it lasts until the
    server restarts)."""

    address: str
    role: str
    saved: bool


ServerMissed = Unreachable
"""A replica that did not take the change, and why (one line for a person): one the
sentinels see down or could not list (`store.servers`), or one that refused."""


@dataclass(frozen=True)
class AddedUser:
    """Producer's Redis `user` made: its `password_file` (the producer's
    `redis-password`), whether it outlives a restart of every server written
    (`saved`), the `servers` written (the primary first) and the replicas `missed`."""

    user: str
    password_file: Path
    saved: bool
    servers: tuple[ServerWritten, ...]
    missed: tuple[ServerMissed, ...]


@dataclass(frozen=True)
class RemovedUser:
    """Producer's Redis `user` deleted: whether it `existed` on a server written, the
    `servers` written (the primary first) and the replicas `missed`."""

    user: str
    existed: bool
    servers: tuple[ServerWritten, ...]
    missed: tuple[ServerMissed, ...]


_Act = Callable[[Any], tuple[bool, bool]]
"""The change on one server's client: (whether it changed something, whether saved)."""


def add_user(
    client: Any, name: str, password: SecretStr, password_file: Path, *, embedded: bool
) -> AddedUser:
    """Creates or replaces producer `name`'s user with `password` on every data server
    behind `client` (the store's, a user allowed `ACL`: the operator's). With
    `embedded` (the embedded server, whose configuration `runwarden serve` writes with
    every producer's user at each start) the primary counts as saved.

    Raises:
        StoreError: the primary refused or cannot be reached (or no sentinel names it).
    """

    def act(server: Any) -> tuple[bool, bool]:
        set_producer_user(server, name, password)
        return True, save_users(server)

    _, servers, missed = _on_every_server(client, act)
    if embedded:
        servers = (ServerWritten(servers[0].address, servers[0].role, True), *servers[1:])
    saved = all(s.saved for s in servers)
    return AddedUser(producer_user(name), password_file, saved, servers, missed)


def remove_user(client: Any, name: str) -> RemovedUser:
    """Deletes producer `name`'s user on every data server behind `client` (the
    server closes its connections).

    Raises:
        StoreError: the primary refused or cannot be reached (or no sentinel names it).
    """

    def act(server: Any) -> tuple[bool, bool]:
        existed = delete_producer_user(server, name)
        return existed, save_users(server)

    changed, servers, missed = _on_every_server(client, act)
    return RemovedUser(producer_user(name), changed, servers, missed)


def _on_every_server(
    client: Any, act: _Act
) -> tuple[bool, tuple[ServerWritten, ...], tuple[ServerMissed, ...]]:
    """`act` on the primary (its `StoreError` raised), then on each replica (its
    `StoreError` a miss); whether any server changed, those written, those missed."""
    found = data_servers(client)
    try:
        changed, saved = act(found.primary.client)
        written = [_written(found.primary, saved)]
        missed = list(found.unreachable)
        for replica in found.replicas:
            try:
                replica_changed, saved = act(replica.client)
            except StoreError as error:
                missed.append(ServerMissed(replica.address, error_line(error)))
                continue
            changed = changed or replica_changed
            written.append(_written(replica, saved))
    finally:
        found.close()
    return changed, tuple(written), tuple(sorted(missed, key=lambda m: m.address))


def _written(server: DataServer, saved: bool) -> ServerWritten:
    return ServerWritten(server.address, server.role, saved)
