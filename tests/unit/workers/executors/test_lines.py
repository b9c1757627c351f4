"""Property tests of the parsers, quoting and validators that untrusted text reaches:
proofs, status lines, manifests, log lines, run ids, relative paths, globs."""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import subprocess
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import (
    InvalidPath,
    InvalidRunId,
    JobStatus,
    ProofInvalid,
    ProofNone,
    ProofSaved,
    SnapshotReason,
    expected_checkpoint,
    parse_proof,
    safe_relpath,
    validate_run_id,
)
from workers.executors import (
    FileDigest,
    InvalidArgument,
    LineStream,
    ProtocolError,
    glob_match,
    parse_manifest,
    parse_status,
    quote,
)
from workers.executors.lines import Skip, complete_lines, utf8_cut
from workers.executors.scripts import parse_statuses

U64_MAX = 2**64 - 1
ASCII_WHITESPACE = frozenset(b" \t\n\r\x0c")
LINE_END = re.compile(rb"\r\n|\r|\n")
SHELLS = [("sh",), ("busybox", "sh")]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
reasons = st.none() | st.sampled_from([r.value for r in SnapshotReason]) | st.text(max_size=12)
extras = st.dictionaries(
    st.text(max_size=10).filter(lambda k: k not in ("checkpoint", "step", "reason")),
    json_values,
    max_size=4,
)


# --- proofs --------------------------------------------------------------------------


@given(st.binary(max_size=600))
def test_parse_proof_never_raises(content: bytes) -> None:
    got = parse_proof(content)
    assert isinstance(got, ProofNone | ProofSaved | ProofInvalid)
    assert isinstance(got, ProofNone) == all(b in ASCII_WHITESPACE for b in content)


@given(st.lists(st.sampled_from(sorted(ASCII_WHITESPACE)), max_size=50).map(bytes))
def test_ascii_whitespace_is_no_proof(content: bytes) -> None:
    assert parse_proof(content) == ProofNone()


@given(st.text(alphabet='{}[]":,0123456789 \n-.tfnulrecktpos\\', max_size=80))
def test_parse_proof_on_json_looking_text(text: str) -> None:
    got = parse_proof(text.encode())
    assert isinstance(got, ProofNone | ProofSaved | ProofInvalid)
    if isinstance(got, ProofSaved):
        assert got.snapshot.checkpoint == expected_checkpoint(got.snapshot.step)


wrong_checkpoints = st.one_of(
    st.text(max_size=40),
    st.integers().map(lambda n: f"output/checkpoint-{n}"),
    st.integers(0, U64_MAX).map(lambda n: f"output/checkpoint-{n:03d}"),
    st.integers(0, 99).map(lambda n: f"./output/checkpoint-{n}"),
    st.integers(0, 99).map(lambda n: f"output/checkpoint-{n}/"),
    st.integers(0, 99).map(lambda n: f"/output/checkpoint-{n}"),
)


@given(st.integers(0, U64_MAX), wrong_checkpoints, reasons, extras, st.sampled_from([None, 2]))
def test_a_proof_naming_another_checkpoint_is_invalid(
    step: int, checkpoint: str, reason: str | None, extra: dict[str, Any], indent: int | None
) -> None:
    if checkpoint == expected_checkpoint(step):
        checkpoint += "x"
    written = extra | {"checkpoint": checkpoint, "step": step, "reason": reason}
    got = parse_proof(json.dumps(written, indent=indent).encode())
    assert isinstance(got, ProofInvalid)


@given(
    st.integers(0, U64_MAX),
    reasons,
    extras,
    st.tuples(st.sampled_from([None, 2]), st.booleans(), st.booleans()),
)
def test_a_valid_proof_is_saved(
    step: int,
    reason: str | None,
    extra: dict[str, Any],
    style: tuple[int | None, bool, bool],
) -> None:
    indent, ascii_only, omit_null = style
    written = extra | {"checkpoint": expected_checkpoint(step), "step": step}
    if reason is not None or not omit_null:
        written["reason"] = reason
    content = json.dumps(written, indent=indent, ensure_ascii=ascii_only).encode()
    got = parse_proof(content)
    assert isinstance(got, ProofSaved), got
    assert got.snapshot.step == step
    assert got.snapshot.checkpoint == expected_checkpoint(step)
    assert got.snapshot.reason is SnapshotReason.parse(reason)


@given(st.integers(0, U64_MAX), st.one_of(st.booleans(), st.floats(), st.text(max_size=5)))
def test_a_step_of_another_type_is_invalid(step: int, wrong: Any) -> None:
    content = json.dumps({"checkpoint": expected_checkpoint(step), "step": wrong})
    assert isinstance(parse_proof(content.encode()), ProofInvalid)


@given(st.integers(max_value=-1) | st.integers(min_value=2**64))
def test_a_step_out_of_u64_is_invalid(step: int) -> None:
    content = json.dumps({"checkpoint": expected_checkpoint(step), "step": step})
    assert isinstance(parse_proof(content.encode()), ProofInvalid)


# --- status lines --------------------------------------------------------------------

statuses = st.one_of(
    st.sampled_from([JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.LOST]),
    st.integers(-(2**31), 2**31 - 1).map(JobStatus.exited),
)


def status_line(status: JobStatus) -> str:
    """The line `status_script` prints for `status`."""
    return f"exited {status.code}" if status.kind == "exited" else status.kind


@given(st.text(max_size=40))
def test_parse_status_returns_a_status_or_a_protocol_error(text: str) -> None:
    try:
        got = parse_status(text)
    except ProtocolError:
        return
    assert isinstance(got, JobStatus)
    assert status_line(got) == text.strip() or text.strip().startswith("exited ")


@given(st.text(alphabet="exitd runglcaso-0123456789\n\t", max_size=24))
def test_parse_status_on_status_looking_text(text: str) -> None:
    try:
        got = parse_status(text)
    except ProtocolError:
        return
    assert got.kind == "exited" or status_line(got) == text.strip()
    if got.kind == "exited":
        assert text.strip().startswith("exited ")
        assert got.code == int(text.strip()[7:])


@given(statuses, st.sampled_from(["", "\n", " ", "\r\n"]))
def test_status_lines_round_trip(status: JobStatus, end: str) -> None:
    assert parse_status(status_line(status) + end) == status


@given(st.integers(2**31, 10**11 - 1) | st.integers(-(10**11) + 1, -(2**31) - 1))
def test_exit_codes_out_of_i32_are_protocol_errors(code: int) -> None:
    with pytest.raises(ProtocolError):
        parse_status(f"exited {code}")


@given(st.lists(statuses, max_size=6), st.integers(0, 8))
def test_parse_statuses_counts_lines(expected: list[JobStatus], count: int) -> None:
    output = "".join(status_line(s) + "\n" for s in expected).encode()
    if count == len(expected):
        assert parse_statuses(output, count) == expected
    else:
        with pytest.raises(ProtocolError):
            parse_statuses(output, count)


# --- manifests -----------------------------------------------------------------------

hexes = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
components = st.text(min_size=1, max_size=12).filter(
    lambda c: "\0" not in c and "/" not in c and c not in (".", "..")
)
relative_paths = st.lists(components, min_size=1, max_size=3).map("/".join)


def record(sha: str, path: str, mode: bytes = b"  ") -> bytes:
    return sha.encode() + mode + b"./" + os.fsencode(path) + b"\0"


@given(st.binary(max_size=400))
def test_parse_manifest_returns_digests_or_a_protocol_error(output: bytes) -> None:
    try:
        got = parse_manifest(output)
    except ProtocolError:
        return
    assert got == sorted(got)


@given(
    st.lists(
        st.tuples(hexes, st.binary(max_size=20), st.sampled_from([b"  ", b" *", b" ", b"\t"])),
        max_size=4,
    )
)
def test_parse_manifest_on_record_shaped_bytes(records: list[tuple[str, bytes, bytes]]) -> None:
    output = b"".join(sha.encode() + mode + b"./" + path + b"\0" for sha, path, mode in records)
    try:
        got = parse_manifest(output)
    except ProtocolError:
        return
    for digest in got:
        safe_relpath(digest.path)


@given(
    st.lists(st.tuples(relative_paths, hexes), max_size=8, unique_by=lambda pair: pair[0]),
    st.sampled_from([b"  ", b" *"]),
)
def test_manifests_round_trip(files: list[tuple[str, str]], mode: bytes) -> None:
    output = b"".join(record(sha, path, mode) for path, sha in files)
    assert parse_manifest(output) == sorted(FileDigest(path, sha) for path, sha in files)


@given(
    st.lists(components, max_size=3),
    st.lists(components, max_size=3),
    st.sampled_from(["..", ".", ""]),
    hexes,
)
def test_a_manifest_path_leaving_the_root_is_a_protocol_error(
    before: list[str], after: list[str], bad: str, sha: str
) -> None:
    path = "/".join([*before, bad, *after])
    with pytest.raises(ProtocolError):
        parse_manifest(record(sha, path))


@given(relative_paths, hexes)
def test_an_absolute_manifest_path_is_a_protocol_error(path: str, sha: str) -> None:
    with pytest.raises(ProtocolError):
        parse_manifest(record(sha, "/" + path))
    with pytest.raises(ProtocolError):
        parse_manifest(record(sha, path)[:-1])  # not NUL-terminated


# --- complete lines ------------------------------------------------------------------


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


# --- utf8_cut ------------------------------------------------------------------------


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


# --- quote ---------------------------------------------------------------------------

shell_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=60
)


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
@settings(max_examples=60, deadline=None)
@given(text=shell_text)
def test_quote_is_one_word_expanding_to_itself(shell: tuple[str, ...], text: str) -> None:
    script = f'set -- {quote(text)}; printf \'%s|%s\' "$#" "$1"'
    out = subprocess.run([*shell, "-c", script], capture_output=True, check=True, timeout=10)
    assert out.stdout == b"1|" + text.encode()


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="'\"\\$`!*?[]{}()<>;&| \t\n~#=%-a", max_size=30))
def test_quote_survives_shell_syntax(shell: tuple[str, ...], text: str) -> None:
    out = subprocess.run(
        [*shell, "-c", "printf %s " + quote(text)], capture_output=True, check=True, timeout=10
    )
    assert out.stdout == text.encode()
    assert out.stderr == b""


@given(st.text(max_size=20), st.text(max_size=20))
def test_quote_refuses_nul(before: str, after: str) -> None:
    with pytest.raises(InvalidArgument):
        quote(before + "\0" + after)


@given(shell_text)
def test_quote_is_single_quoted(text: str) -> None:
    quoted = quote(text)
    assert quoted.startswith("'")
    assert quoted.endswith("'")
    assert quoted.replace("'\\''", "").count("'") == 2


# --- run ids and relative paths ------------------------------------------------------

run_id_text = st.text(max_size=70) | st.text(alphabet="az09_.-/ A\n", max_size=70)


@given(run_id_text)
def test_validate_run_id_accepts_only_single_safe_components(text: str) -> None:
    try:
        got = validate_run_id(text)
    except InvalidRunId:
        return
    assert got == text
    assert posixpath.normpath(posixpath.join("/root", text)) == "/root/" + text
    assert "/" not in text
    assert not text.startswith(("-", "."))
    assert 1 <= len(text) <= 64
    assert text == text.strip()
    assert text.isascii()


path_text = st.text(max_size=40) | st.text(alphabet="ab./\0 -", max_size=20)


@given(path_text)
def test_safe_relpath_never_leaves(text: str) -> None:
    try:
        got = safe_relpath(text)
    except InvalidPath:
        return
    assert got == text
    joined = posixpath.join("/root", text)
    assert posixpath.normpath(joined) == joined
    assert posixpath.normpath(joined).startswith("/root/")


@given(relative_paths)
def test_safe_relpath_accepts_every_normal_relative_path(path: str) -> None:
    assert safe_relpath(path) == path


# --- globs ---------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    st.text(alphabet="abAB.*?", min_size=1, max_size=8),
    st.text(alphabet="abAB.\n *?", max_size=12)
    | st.text(max_size=12).filter(lambda n: "/" not in n),
)
def test_glob_match_is_fnmatchcase(pattern: str, name: str) -> None:
    assert glob_match(pattern, name) == fnmatch.fnmatchcase(name, pattern)
