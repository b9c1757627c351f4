"""`runwarden producers add|ls|rm`: the services allowed to publish to runwarden, each
with its own signing key in this machine's secrets directory (`schemas.auth`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .common import app, fail, json_option, one_line, print_json, run_op, say
from .helpfmt import PlainTyper

if TYPE_CHECKING:
    from collections.abc import Sequence

    from schemas import Settings

    from ..redis_users import ServerMissed, ServerWritten

__all__ = ["producers_add", "producers_ls", "producers_rm"]

producers_app = PlainTyper(
    help="Producers: the services allowed to publish, each with its own key.",
    epilog="Example: runwarden producers add billing",
    no_args_is_help=True,
)
app.add_typer(producers_app, name="producers")
_PREFIX, _SUFFIX = "producer.", ".key"
ProducerName = Annotated[
    str,
    typer.Argument(
        metavar="NAME",
        help="The producer's name: 1-32 of a-z0-9-, starting with a "
        "letter; a stop it asks is recorded as asked by it.",
    ),
]


def serving(settings: Settings) -> bool:
    """Whether the service's Redis answers (a configured URL is taken as answering:
    its errors then say why)."""
    from ..embedded import EmbeddedRedis

    return settings.redis_url is not None or EmbeddedRedis(settings).ping()


def _key_file(name: str) -> str:
    """The key file's name of producer `name`; an invalid name is bad input (exit 2)."""
    from schemas.secrets import SecretsError, producer_key_file

    try:
        return producer_key_file(name)
    except SecretsError as error:
        fail(one_line(error), 2)


@producers_app.command("add")
def producers_add(
    name: ProducerName,
    as_json: Annotated[bool, json_option("the key's record (name, key_file, created)")] = False,
) -> None:
    """Create the signing key of producer NAME (once; an existing key is kept) and
    print where it is: give that file to the service (it signs every message with
    it), and put the same file in every worker's secrets directory. When the
    service's Redis can be reached, also create NAME's Redis user, which can publish
    the public tasks and read their results and nothing else, on the primary and each
    replica the sentinels list, and print the file of its password and the servers
    written (docs/security.md, "Redis users"). A replica that is down or refuses is
    named with the reason: run this again once it is back (the key and password are
    kept). A stop it asks is recorded as asked by NAME. docs/integrating.md: a
    producer's key.

    \b
    Examples:
      runwarden producers add billing
      runwarden producers add billing --json
    """
    from schemas import RunError, Settings
    from schemas.auth import OPERATOR, WORKER
    from schemas.secrets import producer_redis_password_file

    from ..api import Runwarden

    settings = Settings()
    file_name = _key_file(name)
    _, created = run_op(lambda: settings.secrets.ensure(file_name))
    where = settings.secrets.path / file_name
    record: dict[str, object] = {"name": name, "key_file": str(where), "created": created}
    lines = [f"{'created' if created else 'kept'} {where}"]
    if name not in (OPERATOR, WORKER) and not serving(settings):
        # Its password is made now: `runwarden serve` makes the user at its start.
        run_op(lambda: settings.secrets.ensure(producer_redis_password_file(name)))
        record["redis_user"] = None
        lines.append("no Redis user made yet (nothing is serving: `runwarden serve` makes it)")
    elif name not in (OPERATOR, WORKER):
        try:
            added = Runwarden(settings).add_producer_user(name)
        except RunError as error:
            # Its key works without a user of its own: it then shares the password.
            record["redis_user"] = None
            lines.append(f"no Redis user made ({one_line(error)})")
        else:
            record |= {
                "redis_user": added.user,
                "redis_password_file": str(added.password_file),
                "redis_user_saved": added.saved,
                **_spread_fields(added.servers, added.missed, _again("add", name)),
            }
            lines.append(
                f"Redis user {added.user}: its password is {added.password_file} (the "
                "producer's `redis-password`)"
            )
            lines.append(f"written on {_servers(added.servers)}")
            lines += _missed_lines("not written on", added.missed, "add", _again("add", name))
    if as_json:
        print_json(record)
        return
    for line in lines:
        say(line)


@producers_app.command("ls")
def producers_ls(
    as_json: Annotated[bool, json_option("the producers' names")] = False,
) -> None:
    """List the producers that have a key in this machine's secrets directory.

    \b
    Examples:
      runwarden producers ls
      runwarden producers ls --json
    """
    from schemas import Settings

    settings = Settings()
    names = [
        n[len(_PREFIX) : -len(_SUFFIX)]
        for n in settings.secrets.names()
        if n.startswith(_PREFIX) and n.endswith(_SUFFIX)
    ]
    if as_json:
        print_json(names)
        return
    for name in names:
        say(name)


@producers_app.command("rm")
def producers_rm(
    name: ProducerName,
    as_json: Annotated[bool, json_option("what was removed, and where")] = False,
) -> None:
    """Remove producer NAME's key: its messages are refused from then on (workers read
    their keys again within seconds); and its Redis user, when the service's Redis can
    be reached, on the primary and each replica the sentinels list (its connections
    are closed). A replica that is down keeps the user: run this again once it is
    back (it then removes the user even though the key is gone).

    \b
    Examples:
      runwarden producers rm billing
      runwarden producers rm billing --json
    """
    from schemas.auth import OPERATOR, WORKER

    if name in (OPERATOR, WORKER):
        fail(f"{name} is the service's own producer: it cannot be removed", 2)
    from schemas import RunError, Settings
    from schemas.secrets import producer_redis_password_file

    from ..api import Runwarden

    settings = Settings()
    file_name = _key_file(name)
    had_key = settings.secrets.remove(file_name)
    record: dict[str, object] = {"name": name, "key_removed": had_key, "redis_user": None}
    lines = [f"removed producer {name}"] if had_key else []
    if not serving(settings):
        if not had_key:
            fail(f"no producer {name!r}", 2)
        settings.secrets.remove(producer_redis_password_file(name))
    else:
        try:
            removed = Runwarden(settings).remove_producer_user(name)
        except RunError as error:
            # Its password goes anyway: `runwarden serve` never makes the user again.
            settings.secrets.remove(producer_redis_password_file(name))
            if not had_key:
                fail(f"no producer {name!r} (and its Redis user: {one_line(error)})", 2)
            record["redis_error"] = one_line(error)
            lines.append(f"its Redis user was not removed ({one_line(error)})")
        else:
            if not had_key and not removed.existed and not removed.missed:
                fail(f"no producer {name!r}", 2)
            record |= {
                "redis_user": removed.user,
                "redis_user_existed": removed.existed,
                **_spread_fields(removed.servers, removed.missed, _again("rm", name)),
            }
            if removed.existed:
                lines.append(
                    f"removed its Redis user {removed.user} from {_servers(removed.servers)}"
                )
            lines += _missed_lines(
                f"its Redis user {removed.user} may still be on",
                removed.missed,
                "remove",
                _again("rm", name),
            )
    if as_json:
        print_json(record)
        return
    for line in lines:
        say(line)


def _servers(servers: Sequence[ServerWritten]) -> str:
    """The servers written, for a person: `host:port (primary), host:port (replica)`,
    each not saved to an ACL file marked so."""
    return ", ".join(
        f"{s.address} ({s.role}{'' if s.saved else ', until it restarts: no ACL file'})"
        for s in servers
    )


def _again(verb: str, name: str) -> str:
    """The command that makes a user change again (`runwarden producers VERB NAME`)."""
    return f"runwarden producers {verb} {name}"


def _missed_lines(what: str, missed: Sequence[ServerMissed], action: str, again: str) -> list[str]:
    """One line per replica missed: where, the exact reason, and what to do (`action`
    it there by running `again` once it is back)."""
    return [
        f"{what} {m.address}: {m.reason}; {action} it there when it is back: {again} again"
        for m in missed
    ]


def _spread_fields(
    servers: Sequence[ServerWritten], missed: Sequence[ServerMissed], again: str
) -> dict[str, object]:
    """The `--json` fields of where a user change went: `redis_servers` (address,
    role, saved) and `redis_missed` (address, reason, and the command to run again
    once it is back)."""
    return {
        "redis_servers": [{"address": s.address, "role": s.role, "saved": s.saved}
                          for s in servers],
        "redis_missed": [{"address": m.address, "reason": m.reason,
                          "again": again} for m in missed],
    }  # fmt: skip
