"""Complete lines out of a growing file: what `tail` yields.

A line ends at `\\n` or `\\r` (a progress bar redrawn with `\\r` yields each frame;
`\\r\\n` is one end). A line longer than the read cap is emitted cut at a UTF-8
boundary, so a reader never stalls on it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Literal, Protocol

from schemas.protocol import MAX_TAIL_READ

__all__ = ["LineStream", "Reader", "Skip", "complete_lines", "utf8_cut"]

_LINE_END = re.compile(rb"\r\n|\r|\n")


class Reader(Protocol):
    """What a [`LineStream`] reads through: an executor's `read_from`."""

    def read_from(self, path: str, offset: int, limit: int) -> bytes: ...


def utf8_cut(data: bytes) -> int:
    """The length of the longest prefix of `data` that does not end inside a UTF-8
    multi-byte sequence; `len(data)` when `data` is not UTF-8 near its end (a cut
    that cannot be improved is still a cut, never zero for non-empty data)."""
    end = len(data)
    back = 0
    while back < 3 and end - back > 0 and (data[end - back - 1] & 0xC0) == 0x80:
        back += 1
    if end - back == 0:
        return end
    lead = data[end - back - 1]
    if lead < 0x80:
        return end
    if lead >> 5 == 0b110:
        need = 2
    elif lead >> 4 == 0b1110:
        need = 3
    elif lead >> 3 == 0b11110:
        need = 4
    else:
        return end
        return end
    if back + 1 >= need:
        return end  # the last sequence is complete
    cut = end - back - 1
    return cut if cut > 0 else end


Skip = Literal["", "lf", "eol"]
"""What to drop at the start of the next read: nothing; a `\n` completing a `\r`
that ended the previous read; or the line end of a line that was emitted cut at
the cap (`\n`, `\r\n` or `\r`)."""


def complete_lines(
    data: bytes, *, cap: int | None = None, skip: Skip = ""
) -> tuple[list[str], int, Skip]:
    """Splits `data`, read from a file at some offset, into complete lines.

    Returns `(lines, consumed, skip)`: the lines without their ends, decoded as
    UTF-8 (invalid bytes replaced), the number of bytes of `data` they used (the next
    read starts there), and what the next read must drop first (see [`Skip`]).

    A line longer than `cap` bytes (read `cap + 1` bytes to know) is emitted cut at
    `cap`, backed off to a UTF-8 boundary, when `data` holds no complete line; that
    line's own end, when it comes, is dropped. Lines of at most `cap` bytes always
    come out whole. `cap=None` never cuts.
    """
    lines: list[str] = []
    start = 0
    if skip:
        match = _LINE_END.match(data)
        if skip == "lf":
            start = 1 if data[:1] == b"\n" else 0
        elif match is not None:
            start = match.end()
            if match[0] == b"\r" and start == len(data):
                return lines, start, "lf"
    dropped = start
    next_skip: Skip = ""
    size = len(data)
    for match in _LINE_END.finditer(data, start):
        lines.append(data[start : match.start()].decode("utf-8", "replace"))
        start = match.end()
        next_skip = "lf" if match[0] == b"\r" and start == size else ""
    if not lines and cap is not None and size - start > cap:
        cut = start + utf8_cut(data[start : start + cap])
        lines.append(data[start:cut].decode("utf-8", "replace"))
        return lines, cut, "eol"
    if not lines:
        # Nothing but (perhaps) the dropped line end: a skip still pending stays.
        return lines, start, "" if dropped else skip
    return lines, start, next_skip


class LineStream:
    """Follows the file `path` through `reader` from byte `offset`, one complete line
    at a time. [`LineStream.poll`] reads once; iterating follows for ever (or until
    `until()` is true), sleeping `poll_s` seconds when nothing new came."""

    def __init__(
        self,
        reader: Reader,
        path: str,
        offset: int = 0,
        *,
        max_read: int = MAX_TAIL_READ,
        poll_s: float = 0.5,
    ) -> None:
        if offset < 0 or max_read <= 0:
            raise ValueError("offset is non-negative and max_read positive")
        self.reader = reader
        self.path = path
        self.offset = offset
        """Byte offset of the next read: just past the last line yielded."""
        self.max_read = max_read
        self.poll_s = poll_s
        self._skip: Skip = ""

    def poll(self) -> list[str]:
        """The complete lines written since the last poll (possibly none); advances
        [`LineStream.offset`] past them.

        Raises:
            ExecError: when the file cannot be read.
        """
        # One byte more than the cap tells a line of exactly the cap (complete, its
        # end follows) from a longer one (cut).
        data = self.reader.read_from(self.path, self.offset, self.max_read + 1)
        lines, consumed, self._skip = complete_lines(data, cap=self.max_read, skip=self._skip)
        self.offset += consumed
        return lines

    def follow(self, until: Callable[[], bool] | None = None) -> Iterator[str]:
        """Yields lines as they come; stops once `until()` is true after a poll that
        found nothing new (so everything written before is yielded)."""
        while True:
            lines = self.poll()
            yield from lines
            if not lines:
                if until is not None and until():
                    return
                time.sleep(self.poll_s)

    def __iter__(self) -> Iterator[str]:
        return self.follow()
