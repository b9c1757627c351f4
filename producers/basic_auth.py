"""HTTP basic auth's check, shared by the web view (`web/security.py`, an ASGI
middleware) and the metrics endpoint (`metrics.py`, a WSGI app): whether an
`Authorization` header value carries exactly the expected user and password.
Standard library only, so the metrics endpoint needs no web framework for it."""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Final

__all__ = ["AUTH_HEADER_BYTES", "credentials_match"]

AUTH_HEADER_BYTES: Final = 4 * 1024
"""Longest `Authorization` header value looked at; a longer one is refused unread."""


def credentials_match(header: str | None, user: bytes, password: bytes) -> bool:
    """Whether `header` is `Basic <base64 of user:password>` with exactly `user` and
    `password`. Both are compared in constant time (`hmac.compare_digest`, both always
    compared); a missing, oversized, non-basic or undecodable header is no match."""
    if header is None or len(header) > AUTH_HEADER_BYTES:
        return False
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    given_user, sep, given_password = decoded.partition(b":")
    user_ok = hmac.compare_digest(given_user, user)
    password_ok = hmac.compare_digest(given_password, password)
    return bool(sep) & user_ok & password_ok
