"""Redis ACL users of producers: each producer service connects to Redis as a user of
its own, `producer-<name>`, that can publish the public tasks and read their results,
and nothing else (docs/security.md, "Redis users"); the workers' user, `worker`
([`worker_rules`]); and the web view's, `web` ([`web_rules`]).

What such a user may do, all that Celery's Redis transport and result backend need to
send a task and wait for its result (found against a real redis-server, kombu 5):

- `LPUSH` (in `MULTI`/`EXEC`) to the queues of the public tasks, `runwarden`,
  `runwarden.retrieve` and Celery's default `celery` (where a producer without
  routes sends: the bare producer of docs/integrating.md), and their priority lists
  (`<queue>\\x06\\x16<n>`), and `LLEN` of them;
- read and add the exchange bindings (`_kombu.binding*` sets: kombu declares the
  queue it sends to). A binding only routes a message; every task a worker runs is
  signed, checked and idempotent wherever it arrives;
- `GET` a result (`celery-task-meta-<task id>`) and `SUBSCRIBE` to its channel: a task
  id is a random UUID the producer chose, and no pattern subscription or key listing
  is allowed, so it reads no result whose id it does not know.

It cannot read or write a store key (`rw:*`: runs, logs, metrics, targets), delete
any key, list keys, push to the workers' internal queue (`runwarden.watch`), or send
Celery's remote control (`PUBLISH` to the pidbox: shutdown, revoke, stop a queue).
Its password is sent as its SHA-256 (`#<hex>`), so it never reaches Redis in clear.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from pydantic import SecretStr
from redis import ResponseError

from schemas.events import DEFAULT_QUEUE, QUEUE, QUEUE_RETRIEVE, QUEUE_WATCH

from .base import translated

__all__ = [
    "PRODUCER_USER_PREFIX",
    "REPLICA_USER",
    "SENTINEL_USER",
    "WEB_USER",
    "WORKER_USER",
    "delete_producer_user",
    "producer_rules",
    "producer_user",
    "producer_users_config",
    "replica_rules",
    "save_users",
    "sentinel_rules",
    "set_producer_user",
    "set_web_user",
    "set_worker_user",
    "web_rules",
    "worker_rules",
]

PRODUCER_USER_PREFIX: Final = "producer-"
_PRIORITY_SEP: Final = "\x06\x16"
"""kombu's separator between a queue's name and its priority (`<queue>\\x06\\x16<n>`)."""
_COMMANDS: Final = (
    "+lpush", "+llen", "+multi", "+exec", "+smembers", "+sadd", "+get",
    "+subscribe", "+unsubscribe", "+ping", "+hello", "+select", "+info",
)  # fmt: skip


def producer_user(name: str) -> str:
    """The Redis user of producer `name`."""
    return f"{PRODUCER_USER_PREFIX}{name}"


def producer_rules(password: SecretStr) -> list[str]:
    """The `ACL SETUSER` rules of a producer's user with `password`: everything
    reset, then what the module docstring lists."""
    digest = _digest(password)
    keys = []
    for queue in (QUEUE, QUEUE_RETRIEVE, DEFAULT_QUEUE):
        keys += [f"~{queue}", f"~{queue}{_PRIORITY_SEP}*"]
    return [
        "reset", "on", f"#{digest}", *keys, "~celery-task-meta-*",
        "&celery-task-meta-*", "~_kombu.binding*", "-@all", *_COMMANDS,
    ]  # fmt: skip


WORKER_USER: Final = "worker"
_WORKER_COMMANDS: Final = ("+@all", "-@dangerous", "+info")


def worker_rules(password: SecretStr) -> list[str]:
    """The `ACL SETUSER` rules of the workers' and beat's user with `password`: every
    key and channel and every command but Redis's dangerous ones (`ACL`, `CONFIG`,
    `SHUTDOWN`, `FLUSHALL`, `FLUSHDB`, `KEYS`, `MONITOR`, `DEBUG`, `MODULE`, `SAVE`,
    `REPLICAOF`, `MIGRATE`, `RESTORE`, `CLIENT KILL`, ...), `INFO` kept (the health
    check reads its memory section). A worker holds every run's data by its trade; it
    cannot make users, reconfigure the server (a `CONFIG SET dir` writes files as the
    server's user), shut it down or wipe it."""
    return ["reset", "on", f"#{_digest(password)}", "~*", "&*", *_WORKER_COMMANDS]


WEB_USER: Final = "web"
_WEB_READS: Final = (
    "+get", "+mget", "+getrange", "+hget", "+hgetall", "+hmget", "+lrange", "+xrange",
    "+smembers", "+zrange", "+zrevrange", "+zcard", "+zcount",
)  # fmt: skip
_WEB_KEYLESS: Final = ("+time", "+info", "+ping", "+hello", "+select", "+multi", "+exec")
_QUEUES: Final = (QUEUE, QUEUE_RETRIEVE, QUEUE_WATCH, DEFAULT_QUEUE)


def _selector(*rules: str) -> str:
    """One ACL selector (Redis 7, Valkey): its rules allow a command on their own keys
    and channels, apart from the user's other rules."""
    return "(" + " ".join(rules) + ")"


def web_rules(password: SecretStr) -> list[str]:
    """The `ACL SETUSER` rules of the web view's user with `password` (`runwarden
    serve --web`), each part of what the view does and nothing more (found by running
    every page, JSON route and action of the view against a real redis-server):

    - read the store (`%R~rw:*`), with the read commands its pages use (`GET`, `MGET`,
      `GETRANGE`, `HGET`, `HGETALL`, `HMGET`, `LRANGE`, `XRANGE`, `SMEMBERS`,
      `ZRANGE`, `ZREVRANGE`, `ZCARD`, `ZCOUNT`), and `TIME` and `INFO` for the health
      page;
    - the depth of every queue and of the unacknowledged messages (`LLEN`, `HLEN`
      alone: not the messages themselves);
    - send a stop or a cancel: `LPUSH` (in `MULTI`/`EXEC`) to the `runwarden` queue and
      its priority lists, and kombu's binding sets (`SADD`, `SMEMBERS`);
    - wait for its tasks' results and forget them: `GET`, `DEL` and `SUBSCRIBE` of
      `celery-task-meta-*` (task ids are random UUIDs; no key listing, no pattern
      subscription);
    - `PUBLISH` the `task-sent` event of what it sends (`/<db>.celeryev/*`, a one or
      two digit database: no pattern that the remote control's `/<db>.celery.pidbox`
      channels match).

    It cannot write, delete or list a store key (`rw:*`: runs, targets, logs), read
    the queued messages, push to another queue, send Celery's remote control (`PUBLISH`
    to the pidbox: shutdown, revoke), or run `ACL`, `CONFIG`, `SHUTDOWN`, `FLUSHALL`,
    `KEYS`, `SCAN` or any other command. Its password is sent as its SHA-256."""
    depths = [f"%R~{q}{tail}" for q in _QUEUES for tail in ("", f"{_PRIORITY_SEP}*")]
    return [
        "reset", "on", f"#{_digest(password)}", "%R~rw:*", "-@all", *_WEB_READS,
        *_WEB_KEYLESS,
        _selector(*depths, "%R~unacked", "+llen", "+hlen"),
        _selector(f"~{QUEUE}", f"~{QUEUE}{_PRIORITY_SEP}*", "~_kombu.binding*",
                  "+lpush", "+sadd", "+smembers"),
        _selector("~celery-task-meta-*", "&celery-task-meta-*", "+get", "+del",
                  "+subscribe", "+unsubscribe"),
        _selector("&/[0-9].celeryev/*", "&/[0-9][0-9].celeryev/*", "+publish"),
    ]  # fmt: skip


SENTINEL_USER: Final = "sentinel"
REPLICA_USER: Final = "replica"


def sentinel_rules(password: SecretStr) -> list[str]:
    """The `ACL SETUSER` rules of the user the sentinels log in to the primary and its
    replicas as (`sentinel auth-user`): what Redis's documentation lists for a
    sentinel (watch, publish and read its hello channel, reconfigure a replica,
    rewrite its configuration, kill clients after a failover), no key."""
    return [
        "reset", "on", f"#{_digest(password)}", "allchannels", "-@all", "+multi", "+exec",
        "+slaveof", "+replicaof", "+ping", "+subscribe", "+publish", "+info", "+role",
        "+config|rewrite", "+client|setname", "+client|kill", "+script|kill",
    ]  # fmt: skip


def replica_rules(password: SecretStr) -> list[str]:
    """The `ACL SETUSER` rules of the user a replica syncs from its primary as
    (`masteruser`): the replication commands only, no key. Every data server has it,
    since any of them may be the primary after a failover."""
    return ["reset", "on", f"#{_digest(password)}", "-@all", "+psync", "+replconf", "+ping"]


def _digest(password: SecretStr) -> str:
    return hashlib.sha256(password.get_secret_value().encode()).hexdigest()


def _conf_word(word: str) -> str:
    """`word` as one double-quoted argument of a Redis configuration file."""
    quoted = "".join(c if c.isprintable() and c not in '"\\' else f"\\x{ord(c):02x}" for c in word)
    return f'"{quoted}"'


def producer_users_config(
    passwords: dict[str, SecretStr],
    worker: SecretStr | None = None,
    web: SecretStr | None = None,
) -> str:
    """The `user` lines of a Redis configuration file defining the user of each
    producer of `passwords` (name -> password), with `worker` the workers' user
    ([`worker_rules`]), and with `web` the web view's ([`web_rules`]): how the
    embedded server gets them at each start (`producers.embedded`)."""
    users = [(producer_user(n), producer_rules(p)) for n, p in sorted(passwords.items())]
    if worker is not None:
        users.append((WORKER_USER, worker_rules(worker)))
    if web is not None:
        users.append((WEB_USER, web_rules(web)))
    lines = []
    for user, rules in users:
        lines.append("user " + " ".join(_conf_word(w) for w in [user, *rules]) + "\n")
    return "".join(lines)


@translated
def set_producer_user(client: Any, name: str, password: SecretStr) -> None:
    """Creates or replaces producer `name`'s user on the server of `client` (a redis-py
    client of a user allowed `ACL`: the operator's).

    Raises:
        StoreError: the server refused (no ACL rights, a server without ACLs) or
            cannot be reached.
    """
    client.execute_command("ACL", "SETUSER", producer_user(name), *producer_rules(password))


@translated
def set_worker_user(client: Any, password: SecretStr) -> None:
    """Creates or replaces the workers' user ([`worker_rules`]) on the server of `client`
    (a redis-py client of a user allowed `ACL`: the operator's), as a deployment with a
    Redis of its own does once.

    Raises:
        StoreError: the server refused or cannot be reached.
    """
    client.execute_command("ACL", "SETUSER", WORKER_USER, *worker_rules(password))


@translated
def set_web_user(client: Any, password: SecretStr) -> None:
    """Creates or replaces the web view's user ([`web_rules`]) on the server of
    `client` (a redis-py client of a user allowed `ACL`: the operator's).

    Raises:
        StoreError: the server refused (one without ACL selectors: Redis before 7) or
            cannot be reached.
    """
    client.execute_command("ACL", "SETUSER", WEB_USER, *web_rules(password))


@translated
def delete_producer_user(client: Any, name: str) -> bool:
    """Deletes producer `name`'s user; whether it existed.

    Raises:
        StoreError: the server refused or cannot be reached.
    """
    return bool(client.execute_command("ACL", "DELUSER", producer_user(name)))


@translated
def save_users(client: Any) -> bool:
    """Writes the server's users to its ACL file (`ACL SAVE`), so they survive a restart;
    False when the server has no ACL file (its users then last until it restarts:
    `runwarden serve` sets them again at each start of the embedded server).

    Raises:
        StoreError: the server refused for another reason or cannot be reached.
    """
    try:
        client.execute_command("ACL", "SAVE")
    except ResponseError as error:
        if "acl file" in str(error).lower() or "aclfile" in str(error).lower():
            return False
        raise
    return True
