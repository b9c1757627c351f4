"""Text for the web view: job-written text made safe to show, and the formats of
times, durations and sizes shared by the pages and their script (`static/web.js`
formats countdowns exactly as [`left_text`] does).

Cleaning is not escaping: `schemas.text.clean_text` removes what a
terminal would interpret (ANSI escape sequences, control characters) and the
characters that reorder text on screen (bidirectional overrides); HTML escaping is
Jinja's autoescape, applied after it to everything a template prints (see
`render.py`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from schemas.text import duration_text

__all__ = ["LINE_CHARS", "cut", "left_text", "utc_text"]

LINE_CHARS: Final = 2000
"""Characters of one log line shown; the rest is cut (`runwarden logs` prints it all)."""

def cut(text: str, limit: int = LINE_CHARS) -> str:
    """`text`, cut to `limit` characters with `…` appended when it was longer."""
    return text if len(text) <= limit else text[:limit] + "…"


def utc_text(moment: datetime | None) -> str:
    """`YYYY-MM-DD HH:MM:SS UTC`, or an empty string for None."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def left_text(seconds: float) -> str:
    """Time left until a deadline, for people: `in 42 s`, `in 3 min 05 s`,
    `in 2 h 07 min`; a passed deadline: `overdue by 4 s` (see [`duration_text`])."""
    amount = duration_text(seconds)
    return f"in {amount}" if round(seconds) >= 0 else f"overdue by {amount}"
