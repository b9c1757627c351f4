"""The bounds of a run's log and metrics streams: each entry at most a line cap, each
stream at most a byte budget and an entry cap, trimmed oldest first, exactly, in the
same Lua step that appends (`store/lua/append_stream.lua`).

How, without reading what it drops: an entry's id is `<n>-1`, n the bytes the stream
had taken in before it, and `streambytes:<id>` keeps the start of the next one; the
bytes from an entry to the end are that counter minus the entry's id, so the budget
is one `XTRIM MINID` (counter - budget), the cap one `XTRIM MAXLEN`, both exact.
Appending costs one XADD a line, whatever is trimmed.

What an entry costs: the UTF-8 bytes of its value plus [`ENTRY_OVERHEAD_BYTES`] (its
id and field in the stream's node), so a budget of B bytes keeps about B bytes of
Redis memory: measured on Redis 7, a stream of short lines (50-1000 bytes) takes
1.03-1.16x its values' bytes, 16-32 bytes an entry; a line just above an allocator
size class can take up to 1.25x (one entry a node, rounded up), which is why the
default line cap is 8000 bytes and not 8192. Measured with `bench/redis_memory.py`
(1,000 runs x 100 MiB of log through `Follow.record_tail`, Redis 7.0): Redis held 0.99x the
counted bytes with realistic lines (the 10,000-line cap binds before the 4 MiB
budget: 2.0 GiB in all), 1.025x with every line at the cap (4.2 GiB).
"""

from __future__ import annotations

from typing import Final

__all__ = ["CUT_MARK", "ENTRY_OVERHEAD_BYTES", "cut_line"]

ENTRY_OVERHEAD_BYTES: Final = 24
"""Bytes counted for an entry on top of its value's."""
CUT_MARK: Final = " [runwarden: line cut, {} bytes]"
"""Ends a line the store cut (`{}`: the line's whole length in bytes)."""


def _boundary(data: bytes, limit: int) -> int:
    """The largest index <= `limit` that does not split a UTF-8 character of `data`."""
    end = min(limit, len(data))
    while end > 0 and end < len(data) and (data[end] & 0xC0) == 0x80:
        end -= 1
    return end


def cut_line(line: str, cap: int) -> bytes:
    """`line` as UTF-8 (text that cannot be encoded, lone surrogates, becomes `?`),
    at most `cap` bytes: a longer line is cut at a character boundary and ends with
    [`CUT_MARK`] naming its whole length. `cap` must leave room for the mark (at
    least 64 bytes)."""
    data = line.encode("utf-8", "replace")
    if len(data) <= cap:
        return data
    mark = CUT_MARK.format(len(data)).encode("ascii")
    return data[: _boundary(data, cap - len(mark))] + mark
