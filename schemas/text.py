"""Text for people: sizes in bytes, and job-written text made safe to show."""

from __future__ import annotations

from typing import Final

__all__ = ["format_bytes"]

_KIB: Final = 1024


def format_bytes(n_bytes: float) -> str:
    """`n_bytes` in binary units for a person: `512 B`, `3.0 MiB`, `412 MiB`, `1.2 TiB`
    (one decimal below 100 of a unit, none from 100 on; TiB the largest unit)."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < _KIB or unit == "TiB":
            if unit == "B" or abs(value) >= 100:
                return f"{value:.0f} {unit}"
            return f"{value:.1f} {unit}"
        value /= _KIB
    raise AssertionError("unreachable")
