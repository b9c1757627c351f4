"""Redis behind Sentinel: the URL form of `RUNWARDEN_REDIS_URL` that names the
sentinels and the master they watch, rather than one server.

    sentinel://[user[:password]@]host:port[,host:port...]/<master-name>[?db=N]

- the hosts are the sentinels (port 26379 when left out), tried in order;
- `master-name` is the name the sentinels know the primary by (`sentinel monitor`);
- `db` the database number (0);
- `user` and `password` are the data servers' (the primary's and its replicas'),
  as in a `redis://` URL: give the URL without them and they come from the secrets
  directory (`redis-password`, or `redis-password.<user>` with
  `RUNWARDEN_REDIS_USER`), as for any other URL (`schemas.settings`).

The sentinels' own password (their `requirepass`), if they have one, is the secrets
directory's `redis-sentinel-password` ([`SENTINEL_PASSWORD`]): `Settings.store_url`
adds it to the URL's query as `sentinel_password`, so the URL a process connects with
holds every credential (never log it) and the one in the environment none.

Pure parsing: no Redis, no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

__all__ = [
    "DEFAULT_SENTINEL_PORT",
    "SENTINEL_PASSWORD",
    "SENTINEL_SCHEME",
    "SentinelAddress",
    "is_sentinel",
    "parse_sentinel",
    "with_sentinel_password",
]

SENTINEL_SCHEME: Final = "sentinel"
DEFAULT_SENTINEL_PORT: Final = 26379
SENTINEL_PASSWORD: Final = "redis-sentinel-password"  # noqa: S105 - a file name
"""The secrets directory's file holding the sentinels' password (`requirepass` of
each `redis-sentinel`), when they have one."""
_QUERY: Final = frozenset({"db", "sentinel_password"})


def is_sentinel(url: str) -> bool:
    """Whether `url` names Redis through its sentinels (`sentinel://`)."""
    return url.startswith(f"{SENTINEL_SCHEME}://")


@dataclass(frozen=True)
class SentinelAddress:
    """A parsed `sentinel://` URL. Holds passwords when the URL did: never log it
    (its `repr` hides them; [`public`] is the form for people)."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    def __repr__(self) -> str:
        return f"SentinelAddress({self.public()!r})"

    def public(self) -> str:
        """The address without credentials: `sentinel://h1:26379,h2:26379/mymaster`
        (with `?db=N` when not 0)."""
        hosts = ",".join(f"{_host(h)}:{p}" for h, p in self.sentinels)
        tail = f"?db={self.db}" if self.db else ""
        return f"{SENTINEL_SCHEME}://{hosts}/{self.master}{tail}"

    def kombu_url(self) -> str:
        """The form kombu's `sentinel://` transport and Celery's sentinel result
        backend read: one `sentinel://[user:password@]host:port/db` per sentinel,
        joined with `;` (the master's name goes in the transport options)."""
        auth = ""
        if self.username is not None or self.password is not None:
            user = quote(self.username or "", safe="")
            secret = quote(self.password or "", safe="")
            auth = f"{user}:{secret}@"
        return ";".join(
            f"{SENTINEL_SCHEME}://{auth}{_host(h)}:{p}/{self.db}" for h, p in self.sentinels
        )


def with_sentinel_password(url: str, password: str) -> str:
    """The `sentinel://` `url` with the sentinels' `password` in its query."""
    query = urlencode({"sentinel_password": password})
    return f"{url}{'&' if '?' in url else '?'}{query}"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_sentinel(url: str) -> SentinelAddress:
    """The sentinels, master name, database and credentials of a `sentinel://` URL.

    Raises:
        ValueError: not a `sentinel://` URL, no host, a bad port, no master name, a
            bad `db`, or a query parameter other than `db` and `sentinel_password`.
    """
    if not is_sentinel(url):
        raise ValueError("a Sentinel URL starts with sentinel://")
    parts = urlsplit(url)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, port = _host_port(item.strip())
        sentinels.append((host, port))
    master = unquote(parts.path.strip("/"))
    if not master or "/" in master:
        raise ValueError(
            "a Sentinel URL names its master: sentinel://host:port[,host:port...]/<master-name>"
        )
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - _QUERY
    if unknown:
        raise ValueError(f"a Sentinel URL takes only db= in its query, not {sorted(unknown)}")
    db = 0
    if "db" in query:
        value = query["db"][-1]
        if not value.isdigit() or int(value) > 15:
            raise ValueError(f"db must be a database number 0-15, not {value!r}")
        db = int(value)
    sentinel_password = query["sentinel_password"][-1] if "sentinel_password" in query else None
    return SentinelAddress(tuple(sentinels), master, db, username, password, sentinel_password)


def _host_port(item: str) -> tuple[str, int]:
    if not item:
        raise ValueError("a Sentinel URL names at least one sentinel host:port")
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ValueError(f"no host in the sentinel address {item!r}")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port in the sentinel address {item!r}")
    return host, int(port_text)
