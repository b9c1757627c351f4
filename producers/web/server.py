"""Serving the web view with uvicorn: [`serve`] in the foreground (for
`runwarden serve --web`), [`make_server`] for a caller that runs it itself (the
tests run one in a thread).

Only loopback is bound unless `allow_remote=True` says otherwise: the view speaks
plain HTTP with basic auth, so off this machine it belongs behind a TLS proxy.
"""

from __future__ import annotations

import ipaddress

import uvicorn

from ..api import Runwarden
from ..defaults import DEFAULT_WEB_PORT as DEFAULT_PORT
from .app import create_app

__all__ = ["DEFAULT_PORT", "is_loopback", "make_server", "serve"]



def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine: `localhost` or a loopback address
    (127.0.0.0/8, ::1). `0.0.0.0`, `::` and every other name or address are not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def make_server(
    api: Runwarden,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    user: str,
    password: str,
    flower_url: str | None = None,
    allow_remote: bool = False,
) -> uvicorn.Server:
    """A uvicorn server of the view (see `app.create_app`), not started. Its access
    log names paths only: no credential is ever in a URL or a log line.

    Raises:
        ValueError: `host` is not loopback and `allow_remote` is false; a port
            outside 0-65535 (0: any free port); what `create_app` raises.
    """
    if not is_loopback(host) and not allow_remote:
        raise ValueError(
            f"the web view binds to loopback only; to serve on {host!r}, pass "
            "allow_remote=True (and put it behind TLS)"
        )
    if not 0 <= port <= 65535:
        raise ValueError(f"invalid port {port}")
    app = create_app(api, user=user, password=password, flower_url=flower_url)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        server_header=False,
        proxy_headers=False,
        # The countdowns refresh every 2 s: a keep-alive a little longer than that
        # keeps one connection per open page.
        timeout_keep_alive=10,
    )
    return uvicorn.Server(config)


def serve(
    api: Runwarden,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    user: str,
    password: str,
    flower_url: str | None = None,
    allow_remote: bool = False,
) -> None:
    """Serves the web view in the foreground until SIGINT or SIGTERM (uvicorn's
    handlers, so call it from the main thread).

    Raises:
        ValueError: as [`make_server`]. SystemExit(1): the address cannot be bound
            (uvicorn logs why and exits).
    """
    make_server(
        api, host, port, user=user, password=password, flower_url=flower_url,
        allow_remote=allow_remote,
    ).run()  # fmt: skip
