"""How much memory Redis uses, against its `maxmemory`: the service runs Redis with
`noeviction`, so at the limit Redis refuses writes (a stop could not be recorded);
[`MemoryUse.high`] says when a person should act first."""

from __future__ import annotations

from typing import Any, NamedTuple

from schemas import StoreError
from schemas.health_report import MEMORY_WARN_FRACTION
from schemas.text import format_bytes

from .base import text

__all__ = ["MEMORY_WARN_FRACTION", "MemoryUse", "memory_use"]



class MemoryUse(NamedTuple):
    """Redis's memory, from `INFO memory`."""

    used: int
    """`used_memory`: bytes Redis has allocated for its data and itself."""
    max: int | None
    """`maxmemory` in bytes; None when Redis has no limit (0)."""
    policy: str
    """`maxmemory_policy` (`noeviction` for the service's own Redis)."""

    @property
    def fraction(self) -> float | None:
        """`used / max`; None without a limit."""
        return None if not self.max else self.used / self.max

    @property
    def high(self) -> bool:
        """Whether use is above [`MEMORY_WARN_FRACTION`] of the limit."""
        fraction = self.fraction
        return fraction is not None and fraction > MEMORY_WARN_FRACTION

    def text(self) -> str:
        """The use for a person: `1.7 GiB of 2.0 GiB (85 %, noeviction)`, or
        `1.7 GiB, no maxmemory`."""
        if self.max is None:
            return f"{format_bytes(self.used)}, no maxmemory"
        return (
            f"{format_bytes(self.used)} of {format_bytes(self.max)} "
            f"({100 * (self.fraction or 0.0):.0f} %, {self.policy or 'policy unknown'})"
        )

    def warning(self) -> str | None:
        """What a person must read when use is [`high`], None otherwise."""
        if not self.high:
            return None
        return (
            f"Redis memory is high: {self.text()}; at the limit Redis refuses writes and "
            "no stop can be recorded: raise RUNWARDEN_REDIS_MAXMEMORY, or lower "
            "RUNWARDEN_RETENTION_DAYS or RUNWARDEN_LOG_BYTES_PER_RUN"
        )


def _number(info: dict[str, Any], name: str) -> int:
    try:
        value = int(info[name])
    except (KeyError, TypeError, ValueError) as error:
        raise StoreError(f"run store: Redis's INFO memory has no number {name!r}") from error
    if value < 0:
        raise StoreError(f"run store: Redis's INFO memory says {name} = {value}")
    return value


def memory_use(client: Any) -> MemoryUse:
    """Redis's memory use now, and its limit (`INFO memory` of `client`).

    Raises:
        StoreError: its answer lacks the numbers. A Redis error propagates (the
            caller translates it).
    """
    info = client.info("memory")
    if not isinstance(info, dict):
        raise StoreError("run store: Redis's INFO memory is not a section")
    info = {text(k): v for k, v in info.items()}
    limit = _number(info, "maxmemory")
    policy = info.get("maxmemory_policy", "")
    return MemoryUse(
        used=_number(info, "used_memory"),
        max=limit or None,
        policy=text(policy) if isinstance(policy, bytes | str) else str(policy),
    )
