"""Redis's memory, watched by the workers: the service runs Redis with `maxmemory` and
`noeviction`, so at the limit Redis refuses writes and no stop can be recorded. Above
80 % of the limit (`store.MEMORY_WARN_FRACTION`) the workers log a warning, at most
once every [`MEMORY_CHECK_S`] per process, from `reconcile`."""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

from schemas import StoreError
from store import MemoryUse

from .context import Context

__all__ = ["MEMORY_CHECK_S", "watch_memory"]

log = logging.getLogger("runwarden")

MEMORY_CHECK_S: Final = 300.0
"""Least time between two looks at Redis's memory in one process, in seconds."""

_lock = threading.Lock()
_last: list[float] = []
"""When this process last looked (monotonic seconds); empty before the first look.
Kept here, not in Redis: a full Redis refuses the write a shared marker needs, and
that is when the warning matters most."""


def _due(now: float, every_s: float) -> bool:
    with _lock:
        if _last and now - _last[0] < every_s:
            return False
        _last[:] = [now]
        return True


def watch_memory(ctx: Context, every_s: float = MEMORY_CHECK_S) -> MemoryUse | None:
    """Reads Redis's memory when this process has not for `every_s` seconds, and logs
    a warning when it is above the warning share of `maxmemory`. Returns what it
    read, None when it did not look or could not read. Never raises: a Redis that
    cannot answer is logged, and the caller goes on."""
    if not _due(time.monotonic(), every_s):
        return None
    try:
        use = ctx.store.health.memory()
    except StoreError as error:
        log.warning("cannot read Redis's memory: %s", error)
        return None
    warning = use.warning()
    if warning is not None:
        log.warning("%s", warning)
    elif use.max is None:
        log.info("Redis has no maxmemory: nothing bounds its memory but the host's")
    return use
