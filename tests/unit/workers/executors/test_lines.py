"""`workers.executors.lines`: complete lines out of a growing file, as properties: whole
short lines whatever the reads, long lines cut at UTF-8 boundaries, never a stall."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.executors import LineStream
from workers.executors.lines import Skip, complete_lines, utf8_cut

LINE_END = re.compile(rb"\r\n|\r|\n")


class GrowingFile:
    """A file in memory that a writer appends to, read as an executor reads."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.reads = 0

    def read_from(self, path: str, offset: int, limit: int) -> bytes:
        assert path == "/run/job.log"
        assert offset >= 0
        assert limit > 0
        self.reads += 1
        return bytes(self.data[offset : offset + limit])


def cut_points(data: st.DataObject, size: int) -> list[int]:
    cuts = data.draw(st.lists(st.integers(0, size), max_size=12))
    return sorted({*cuts, size})


def feed(
    data: st.DataObject, content: bytes, max_read: int
) -> tuple[GrowingFile, LineStream, list[str]]:
    """Appends `content` in arbitrary pieces, polling after each, then polls until
    nothing more comes; checks offset and progress on every poll."""
    file = GrowingFile()
    stream = LineStream(file, "/run/job.log", max_read=max_read, poll_s=0)
    lines: list[str] = []

    def poll() -> bool:
        before = stream.offset
        unread = len(file.data) - before
        got = stream.poll()
        lines.extend(got)
        assert before <= stream.offset <= len(file.data)
        if unread > max_read:
            # More than the cap unread: a line ends in it, or a longer one is cut.
            assert stream.offset > before, "a full read made no progress"
        if got:
            assert stream.offset > before
        return stream.offset > before

    start = 0
    for cut in cut_points(data, len(content)):
        file.data += content[start:cut]
        start = cut
        poll()
    for _ in range(len(content) + 2):
        if not poll():
            break
    unread = bytes(file.data[stream.offset :])
    assert LINE_END.search(unread) is None, "a complete line was left unread"
    assert len(unread) <= max_read
    return file, stream, lines


def short_segments(max_len: int) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max_len).map(lambda b: b.replace(b"\r", b"x").replace(b"\n", b"y"))


@settings(max_examples=150)
@given(st.data(), st.integers(7, 64))
def test_short_lines_come_out_whole(data: st.DataObject, max_read: int) -> None:
    # Every line of at most max_read bytes comes out whole, whatever its end and
    # wherever the reads split it (a `\r\n` across two reads included).
    pieces = data.draw(
        st.lists(
            st.tuples(short_segments(max_read), st.sampled_from([b"\n", b"\r", b"\r\n"])),
            max_size=10,
        )
    )
    tail = data.draw(short_segments(max_read))
    content = b"".join(text + end for text, end in pieces) + tail
    _, stream, lines = feed(data, content, max_read)
    complete = LINE_END.split(content)[:-1]
    assert lines == [segment.decode("utf-8", "replace") for segment in complete]
    assert stream.offset == len(content) - len(tail)


line_text = st.text(
    alphabet=st.sampled_from(["a", "b", " ", "\r", "\n", "é", "€", "😀", "\u0300"]),
    max_size=200,
)


@settings(max_examples=150)
@given(st.data(), st.integers(7, 64), line_text)
def test_long_lines_are_cut_at_utf8_boundaries_and_never_stall(
    data: st.DataObject, max_read: int, text: str
) -> None:
    content = text.encode()
    _, stream, lines = feed(data, content, max_read)
    for line in lines:
        assert len(line.encode()) <= max_read
        assert "\ufffd" not in line
        assert "\r" not in line
        assert "\n" not in line
    consumed = content[: stream.offset]
    assert b"".join(line.encode() for line in lines) == re.sub(rb"[\r\n]", b"", consumed)


@settings(max_examples=150)
@given(st.data(), st.integers(7, 64), st.binary(max_size=300))
def test_any_bytes_never_stall(data: st.DataObject, max_read: int, content: bytes) -> None:
    _, stream, lines = feed(data, content, max_read)
    for line in lines:
        assert "\r" not in line
        assert "\n" not in line
    assert stream.offset <= len(content)


@given(
    st.binary(max_size=200), st.sampled_from([None, 1, 7, 64]), st.sampled_from(["", "lf", "eol"])
)
def test_complete_lines_never_overrun(data: bytes, cap: int | None, skip: Skip) -> None:
    lines, consumed, next_skip = complete_lines(data, cap=cap, skip=skip)
    assert 0 <= consumed <= len(data)
    if next_skip == "lf" and consumed:
        assert data[consumed - 1 : consumed] == b"\r"
        assert consumed == len(data)
    if skip == "lf" and consumed == 0:
        assert not data.startswith(b"\n")
    if next_skip == "eol" and consumed:
        assert len(lines) == 1  # only a line cut at the cap leaves its end pending
    assert LINE_END.search(data[consumed:]) is None


# --- utf8_cut ---------------------------------------------------------------------


@given(st.text(max_size=60), st.data())
def test_utf8_cut_of_valid_text_cut_anywhere(text: str, data: st.DataObject) -> None:
    encoded = text.encode()
    index = data.draw(st.integers(0, len(encoded)))
    prefix = encoded[:index]
    boundaries = [0]
    for char in text:
        boundaries.append(boundaries[-1] + len(char.encode()))
    boundary = max(b for b in boundaries if b <= index)
    cut = utf8_cut(prefix)
    assert 0 <= index - cut <= 3
    if boundary > 0 or index == 0:
        assert cut == boundary
        assert prefix[:cut].decode() == text[: boundaries.index(boundary)]
    else:
        # Inside the very first character: no better cut exists, never zero.
        assert cut == index


@given(st.binary(max_size=40))
def test_utf8_cut_of_any_bytes(data: bytes) -> None:
    cut = utf8_cut(data)
    assert len(data) - 3 <= cut <= len(data)
    assert cut > 0 or not data
