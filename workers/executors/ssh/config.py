"""Where an SSH target is and how to reach it: `user@host[:port]` or an alias of an
ssh config file (HostName, User, Port, IdentityFile, ProxyJump, ProxyCommand,
ConnectTimeout, ServerAliveInterval, UserKnownHostsFile), resolved once into an
[`SshDestination`].

A ProxyCommand (its `%h`, `%p` and `%r` expanded, as paramiko does) is run by the
worker for the first host of a route, without a shell (its words split as a shell
would: no pipes, redirections or variables), its standard input and output the
connection, and ended and reaped with it; a host with both ProxyJump and ProxyCommand
is refused (OpenSSH takes whichever comes first in the file, which paramiko does not
tell).

Host keys are always checked strictly against known_hosts, whatever the config file
says about `StrictHostKeyChecking`: runwarden never trusts a key it has not seen.
"""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import paramiko

from ..errors import InvalidArgument

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_KEEPALIVE_S",
    "MAX_JUMPS",
    "SshDestination",
    "resolve_destination",
]

DEFAULT_CONNECT_TIMEOUT_S: Final = 10.0
DEFAULT_KEEPALIVE_S: Final = 15.0
MAX_JUMPS: Final = 8
_DEST = re.compile(
    r"(?:(?P<user>[^@\s:/]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^@\s:/\[\]]+))"
    r"(?::(?P<port>[0-9]{1,5}))?"
)


@dataclass(frozen=True)
class SshDestination:
    """Everything needed to open one SSH connection; hashable, so it keys the
    connection pool."""

    host: str
    port: int = 22
    user: str = field(default_factory=getpass.getuser)
    identity_files: tuple[Path, ...] = ()
    known_hosts: tuple[Path, ...] = ()
    jumps: tuple[SshDestination, ...] = ()
    """Hops to go through first, in order (ProxyJump)."""
    proxy_command: str | None = None
    """The command whose standard input and output reach this host (ProxyCommand,
    expanded), for the first host of a route; None: a direct connection."""
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    keepalive_s: float = DEFAULT_KEEPALIVE_S
    alias: str | None = None
    """The ssh config alias it was resolved from, for messages."""

    @property
    def route(self) -> tuple[SshDestination, ...]:
        """Every host to connect through, in order, this one last: each jump's own
        route first (a hop's ProxyJump is honoured, as OpenSSH does)."""
        hops: list[SshDestination] = []
        for jump in self.jumps:
            hops.extend(jump.route)
        hops.append(self)
        return tuple(hops)

    @property
    def known_hosts_name(self) -> str:
        """The name known_hosts files use: `host`, or `[host]:port` off port 22."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        shown = f"{self.user}@{self.host}:{self.port}"
        return f"{self.alias} ({shown})" if self.alias else shown


def _split(text: str) -> tuple[str | None, str, int | None]:
    match = _DEST.fullmatch(text.strip())
    if match is None:
        raise InvalidArgument(
            f"invalid SSH destination {text[:100]!r}: use user@host[:port] or an ssh config alias"
        )
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise InvalidArgument(f"invalid SSH port {port}")
    return match["user"], match["v6"] or match["host"], port


def _paths(values: object) -> tuple[Path, ...]:
    if values is None:
        return ()
    items = values if isinstance(values, list) else str(values).split()
    return tuple(Path(str(v)).expanduser() for v in items)


def _seconds(value: object, default: float) -> float:
    try:
        seconds = float(str(value))
    except (TypeError, ValueError):
        return default
    return seconds if seconds > 0 else default


def resolve_destination(
    text: str,
    *,
    port: int | None = None,
    identity: Path | None = None,
    known_hosts: Path | None = None,
    ssh_config: Path | None = None,
    _depth: int = 0,
) -> SshDestination:
    """The destination `text` names: `user@host[:port]`, `host`, `user@[v6]:port`, or
    an alias of `ssh_config`. Explicit arguments win over the config file, which wins
    over defaults (current user, port 22, `~/.ssh/known_hosts`). ProxyJump hops are
    resolved the same way, through the same config and known_hosts.

    Raises:
        InvalidArgument: for a malformed destination, an unreadable config file, a
            ProxyJump chain longer than [`MAX_JUMPS`] (or a loop), or a host with both
            ProxyJump and ProxyCommand.
    """
    if _depth > MAX_JUMPS:
        raise InvalidArgument(f"ProxyJump chain longer than {MAX_JUMPS} hops (a loop?)")
    user, host, text_port = _split(text)
    options: dict[str, object] = {}
    if ssh_config is not None:
        try:
            config = paramiko.SSHConfig.from_path(str(ssh_config))
        except (OSError, paramiko.ConfigParseError) as error:
            raise InvalidArgument(f"cannot read ssh config {ssh_config}: {error}") from error
        options = dict(config.lookup(host))
    alias = host if options.get("hostname", host) != host else None
    resolved_port = port or text_port or int(str(options.get("port", 22)))
    identities = (identity.expanduser(),) if identity else _paths(options.get("identityfile"))
    hosts_files = (
        (known_hosts.expanduser(),)
        if known_hosts
        else _paths(options.get("userknownhostsfile")) or (Path("~/.ssh/known_hosts").expanduser(),)
    )
    jumps: tuple[SshDestination, ...] = ()
    proxy = options.get("proxyjump")
    if proxy and str(proxy).lower() != "none":
        jumps = tuple(
            resolve_destination(
                hop,
                known_hosts=known_hosts,
                ssh_config=ssh_config,
                _depth=_depth + 1,
            )
            for hop in str(proxy).split(",")
        )
    command = options.get("proxycommand")
    proxy_command = None if not command or str(command).lower() == "none" else str(command)
    if proxy_command is not None and jumps:
        raise InvalidArgument(
            f"{host}: both ProxyJump and ProxyCommand are set in {ssh_config}: keep one"
        )
    return SshDestination(
        host=str(options.get("hostname", host)),
        port=resolved_port,
        user=user or str(options.get("user") or getpass.getuser()),
        identity_files=identities,
        known_hosts=hosts_files,
        jumps=jumps,
        proxy_command=proxy_command,
        connect_timeout_s=_seconds(options.get("connecttimeout"), DEFAULT_CONNECT_TIMEOUT_S),
        keepalive_s=_seconds(options.get("serveraliveinterval"), DEFAULT_KEEPALIVE_S),
        alias=alias,
    )
