"""Text for people: sizes in bytes, durations, and job-written text made safe to show
on a terminal or a page."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["clean_text", "duration_text", "error_line", "format_bytes"]

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


def clean_text(text: str) -> str:
    """`text` without terminal escape sequences, control characters (tab excepted;
    line ends become one space) and bidirectional controls: what a job wrote, made
    safe to print on a person's terminal or page. Never raises; idempotent."""
    if text.isprintable():
        return text  # the common case: nothing to remove (tab is not printable)
    return _CONTROLS.sub("", _BREAKS.sub(" ", _ESCAPES.sub("", text)))


def duration_text(seconds: float) -> str:
    """A duration for people, rounded to the second: `42 s`, `3 min 05 s`,
    `2 h 07 min` (a negative one as its absolute value)."""
    span = abs(round(seconds))
    if span < 60:
        return f"{span} s"
    if span < 3600:
        return f"{span // 60} min {span % 60:02d} s"
    return f"{span // 3600} h {span % 3600 // 60:02d} min"


def error_line(error: BaseException) -> str:
    """`error` as one line for a person: its message with every run of whitespace (line
    ends included) made one space, else its type's name when it says nothing."""
    return " ".join(str(error).split()) or type(error).__name__
