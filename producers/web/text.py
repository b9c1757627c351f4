"""Text for the web view: job-written text made safe to show, and the formats of
times, durations and sizes shared by the pages and their script (`static/web.js`
formats countdowns exactly as [`left_text`] does).

Cleaning is not escaping: [`clean`] removes what a terminal would interpret (ANSI
escape sequences, control characters) and the characters that reorder text on
screen (bidirectional overrides); HTML escaping is Jinja's autoescape, applied after
it to everything a template prints (see `render.py`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

__all__ = ["LINE_CHARS", "clean", "cut", "duration_text", "left_text", "size_text", "utc_text"]

LINE_CHARS: Final = 2000
"""Characters of one log line shown; the rest is cut (`runwarden logs` prints it all)."""

# ECMA-48 sequences a terminal interprets: CSI (7- and 8-bit), OSC / DCS / SOS / PM /
# APC strings up to their terminator (BEL or ST) or the end of the text, and the
# two-character escapes. An unterminated string is dropped to the end, as a terminal
# would swallow it.
_ESCAPES: Final = re.compile(
    r"""
      (?:\x1b\[|\x9b) [0-?]* [ -/]* [@-~]
    | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]) [^\x07\x1b\x9c]* (?:\x07|\x1b\\|\x9c)?
    | \x1b [ -/]* [0-~]
    """,
    re.VERBOSE,
)
# Line ends become a space (two words stay two words); every other C0 and C1 control
# character but tab, DEL, and the bidirectional controls (they reorder what a person
# reads) are removed.
_BREAKS: Final = re.compile(r"[\n\r\x0b\x0c\x85\u2028\u2029]+")
_CONTROLS: Final = re.compile(
    r"[\x00-\x08\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def clean(text: str) -> str:
    """`text` without terminal escape sequences, control characters (tab excepted;
    line ends become one space) and bidirectional controls. Never raises; idempotent."""
    if text.isprintable():
        return text  # the common case: nothing to remove (tab is not printable)
    return _CONTROLS.sub("", _BREAKS.sub(" ", _ESCAPES.sub("", text)))


def cut(text: str, limit: int = LINE_CHARS) -> str:
    """`text`, cut to `limit` characters with `…` appended when it was longer."""
    return text if len(text) <= limit else text[:limit] + "…"


def utc_text(moment: datetime | None) -> str:
    """`YYYY-MM-DD HH:MM:SS UTC`, or an empty string for None."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration_text(seconds: float) -> str:
    """A duration for people, rounded to the second: `42 s`, `3 min 05 s`,
    `2 h 07 min` (a negative one as its absolute value)."""
    span = abs(round(seconds))
    if span < 60:
        return f"{span} s"
    if span < 3600:
        return f"{span // 60} min {span % 60:02d} s"
    return f"{span // 3600} h {span % 3600 // 60:02d} min"


def left_text(seconds: float) -> str:
    """Time left until a deadline, for people: `in 42 s`, `in 3 min 05 s`,
    `in 2 h 07 min`; a passed deadline: `overdue by 4 s` (see [`duration_text`])."""
    amount = duration_text(seconds)
    return f"in {amount}" if round(seconds) >= 0 else f"overdue by {amount}"


def size_text(count: int) -> str:
    """A byte count for people, in binary units (`512 B`, `3.4 MiB`)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
