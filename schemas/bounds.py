"""The bounds that keep Redis and the artifact store from growing without limit: how
much of each run's log and metrics the run store keeps, how long it keeps what an
ended run followed, how much memory Redis may use, and how much a retrieval may
write. The defaults here are the settings' defaults (`schemas.settings`); sizes are
bytes, written as Redis writes them ([`parse_size`]).
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import BeforeValidator, Field

__all__ = [
    "ARTIFACT_QUOTA_RUN_BYTES",
    "ARTIFACT_QUOTA_TOTAL_BYTES",
    "ARTIFACT_RESERVE_BYTES",
    "LOG_BYTES_PER_RUN",
    "LOG_LINE_BYTES",
    "METRICS_BYTES_PER_RUN",
    "MIN_STREAM_BYTES",
    "REDIS_MAXMEMORY",
    "RETENTION_DAYS",
    "ByteSize",
    "parse_size",
]

_KIB: Final = 1024
_MIB: Final = 1024 * _KIB
_GIB: Final = 1024 * _MIB

LOG_LINE_BYTES: Final = 8000
"""Longest log line the run store keeps, in UTF-8 bytes (a longer one is cut and
marked). A little under 8 KiB: a stream node holding one such line then fits the
allocator's 8 KiB size class (a line of 8192 bytes costs 10 KiB in Redis)."""
LOG_BYTES_PER_RUN: Final = 4 * _MIB
"""Bytes of log lines the run store keeps per run (the oldest go first)."""
METRICS_BYTES_PER_RUN: Final = 1 * _MIB
"""Bytes of metrics records the run store keeps per run (the oldest go first)."""
MIN_STREAM_BYTES: Final = 64 * _KIB
"""Smallest per-run stream budget accepted: room for a few longest lines."""
RETENTION_DAYS: Final = 30.0
"""Days an ended run's log, metrics, offsets and progress are kept in Redis."""
REDIS_MAXMEMORY: Final = 2 * _GIB
"""Memory the Redis of the service may use (`maxmemory`, with `noeviction`)."""
ARTIFACT_QUOTA_RUN_BYTES: Final = 512 * _GIB
"""Most bytes one run's retrieval may write into the artifact store."""
ARTIFACT_QUOTA_TOTAL_BYTES: Final = 4096 * _GIB
"""Most bytes the artifact store may hold, all runs together."""
ARTIFACT_RESERVE_BYTES: Final = 10 * _GIB
"""Free space a retrieval always leaves on the artifact store's filesystem (the
embedded Redis keeps its append-only file there too)."""

# Redis's units (`redis.conf`): k/m/g are powers of 1000, kb/mb/gb powers of 1024;
# kib/mib/gib/tib are taken too, and tb for symmetry. Case does not matter.
_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": _KIB,
    "kib": _KIB,
    "m": 1000**2,
    "mb": _MIB,
    "mib": _MIB,
    "g": 1000**3,
    "gb": _GIB,
    "gib": _GIB,
    "t": 1000**4,
    "tb": 1024 * _GIB,
    "tib": 1024 * _GIB,
}
_SIZE: Final = re.compile(r"\s*(\d{1,19})\s*([a-z]{0,3})\s*")


def parse_size(value: object) -> int:
    """A size in bytes from an integer, or from text as Redis reads it in its
    configuration: digits and an optional unit, `k`/`m`/`g`/`t` (powers of 1000) or
    `kb`/`mb`/`gb`/`tb` and `kib`/`mib`/`gib`/`tib` (powers of 1024), any case; `2gb`
    is 2147483648, `64mb` 67108864, `1000` 1000.

    Raises:
        ValueError: for anything else (a negative number, a fraction, an unknown
            unit), naming the value.
    """
    if isinstance(value, bool):
        raise ValueError(f"a size is a number of bytes, not {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size is not negative: {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"a size is a number of bytes, not {type(value).__name__}")
    match = _SIZE.fullmatch(value.lower())
    if match is None or match[2] not in _UNITS:
        raise ValueError(
            f"size {value[:40]!r}: write bytes, optionally with a unit "
            "(k, kb, m, mb, g, gb, t, tb, kib, mib, gib, tib)"
        )
    return int(match[1]) * _UNITS[match[2]]


ByteSize = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
"""A settings field holding a size in bytes, given as [`parse_size`] reads it."""
