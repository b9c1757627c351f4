"""Defaults that `runwarden --help` shows and the producer modules use, in a module
that imports nothing: the command line reads them without importing Celery, the store
or the web stack."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_WEB_PORT", "DOCTOR_WAIT_S", "HEALTH_TIMEOUT_S"]

DOCTOR_WAIT_S: Final = 150.0
"""How long `Runwarden.doctor` waits by default: longer than the probe's and the
clock readings' own deadlines together."""
HEALTH_TIMEOUT_S: Final = 2.0
"""Default longest wait on Redis of one connect or reply, in seconds."""
DEFAULT_WEB_PORT: Final = 8350
"""The web view's default port on 127.0.0.1."""
