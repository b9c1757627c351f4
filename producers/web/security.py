"""What guards the web view: HTTP basic auth on every request, response headers that
keep pages from being framed or loading anything foreign, CSRF tokens, the
same-origin check of a POST, and a bounded read of a form.

Basic auth is an ASGI middleware, so it covers every route, the static files and
the not-found answers alike, before any handler runs or any body is read.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Mapping
from hashlib import sha256
from typing import Final
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from schemas import SchemaError

from ..basic_auth import credentials_match

__all__ = [
    "FORM_BYTES",
    "BadForm",
    "BasicAuth",
    "CsrfTokens",
    "SecurityHeaders",
    "cross_site",
    "read_form",
]

FORM_BYTES: Final = 8 * 1024
"""Largest form body accepted; the view's forms are a few dozen bytes."""

_HEADERS: Final = {
    # Every script and style comes from this server: no inline code, no other origin.
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    # Live data behind a password: never kept by a cache.
    "cache-control": "no-store",
}


class BasicAuth:
    """ASGI middleware: every HTTP request must carry `Authorization: Basic` with
    exactly `user` and `password`, else it is answered 401 with a
    `WWW-Authenticate` challenge and goes no further. Both are compared in constant
    time (`hmac.compare_digest`, both always compared). Lifespan events pass; any
    other scope (websockets: the view has none) is refused.

    Raises:
        ValueError: for an empty user or password, or a user holding `:` (basic
            auth could not carry it).
    """

    def __init__(self, app: ASGIApp, *, user: str, password: str, realm: str = "runwarden") -> None:
        if not user or not password:
            raise ValueError("the web view needs a user and a password")
        if ":" in user:
            raise ValueError("the web view's user name cannot hold ':'")
        self.app = app
        self._user = user.encode()
        self._password = password.encode()
        self._challenge = f'Basic realm="{realm}", charset="UTF-8"'

    def allows(self, header: str | None) -> bool:
        """Whether an `Authorization` header value carries the right credentials
        (`producers.basic_auth.credentials_match`)."""
        return credentials_match(header, self._user, self._password)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and self.allows(Headers(scope=scope).get("authorization")):
            await self.app(scope, receive, send)
            return
        response = PlainTextResponse(
            "authentication required\n", 401, headers={"WWW-Authenticate": self._challenge}
        )
        if scope["type"] == "http":
            await response(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1008})


class SecurityHeaders:
    """ASGI middleware adding the view's security headers (a strict content security
    policy, no framing, no sniffing, no caching) to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)


class CsrfTokens:
    """CSRF tokens: `<unix seconds>.<HMAC-SHA256 of them>` under a random key of this
    process, valid for `max_age_s`. A page from this server holds one; a page of
    another site cannot read it (the same-origin policy), so a forged POST lacks it.
    A restart of the server invalidates the tokens of pages already open (a POST
    from one is refused; reloading the page gives a fresh token)."""

    def __init__(self, key: bytes | None = None, max_age_s: float = 12 * 3600.0) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)
        self._max_age_s = max_age_s

    def _mac(self, stamp: str) -> str:
        return hmac.new(self._key, b"csrf:" + stamp.encode(), sha256).hexdigest()

    def issue(self, now: float | None = None) -> str:
        stamp = str(int(time.time() if now is None else now))
        return f"{stamp}.{self._mac(stamp)}"

    def valid(self, token: str | None, now: float | None = None) -> bool:
        """Whether `token` was issued by this object and has not expired."""
        if not token or len(token) > 200:
            return False
        stamp, _, mac = token.partition(".")
        if not stamp.isdigit() or not hmac.compare_digest(mac, self._mac(stamp)):
            return False
        age = (time.time() if now is None else now) - int(stamp)
        return -60 <= age <= self._max_age_s


def cross_site(request: Request) -> str | None:
    """Why a state-changing request does not come from a page of this server, or None
    when it may: its `Sec-Fetch-Site` (when sent) is `same-origin`, and its `Origin`
    (else its `Referer`), when sent, is this server's own origin (scheme, host and
    port of the request). Browsers send at least one of them on a cross-site POST."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"the request came from another site (Sec-Fetch-Site: {site[:40]})"
    own = f"{request.url.scheme}://{request.url.netloc}".lower()
    origin = request.headers.get("origin")
    if origin is not None:
        if origin.lower() != own:
            return f"the request came from another origin ({origin[:100]})"
        return None
    referer = request.headers.get("referer")
    if referer is not None:
        parts = urlsplit(referer)
        if f"{parts.scheme}://{parts.netloc}".lower() != own:
            return "the request came from a page of another origin"
    return None


class BadForm(SchemaError):
    """A form body that is not a small urlencoded form; `status` is the HTTP status
    to answer (413 too large, 415 another content type, 400 unreadable)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


async def read_form(request: Request, limit: int = FORM_BYTES) -> Mapping[str, str]:
    """The `application/x-www-form-urlencoded` body of `request` (the last value of
    a repeated field wins), read up to `limit` bytes.

    Raises:
        BadForm: another content type (415), a larger body (413), a body that is not
            UTF-8 or has more than 20 fields (400).
    """
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise BadForm("a form must be sent as application/x-www-form-urlencoded", 415)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BadForm(f"the form is larger than {limit} bytes", 413)
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20))
    except UnicodeDecodeError as error:
        raise BadForm("the form is not UTF-8", 400) from error
    except ValueError as error:  # more fields than any form of the view has
        raise BadForm("the form has too many fields", 400) from error
