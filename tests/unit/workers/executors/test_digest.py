"""`workers.executors.digest`: the target's manifest parsed (as properties), and globs."""

from __future__ import annotations

import fnmatch
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import safe_relpath
from workers.executors import FileDigest, ProtocolError, glob_match, parse_manifest

# --- manifests --------------------------------------------------------------------


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


# --- globs ------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    st.text(alphabet="abAB.*?", min_size=1, max_size=8),
    st.text(alphabet="abAB.\n *?", max_size=12)
    | st.text(max_size=12).filter(lambda n: "/" not in n),
)
def test_glob_match_is_fnmatchcase(pattern: str, name: str) -> None:
    assert glob_match(pattern, name) == fnmatch.fnmatchcase(name, pattern)


# Regression (found by review, failed before its fix): `glob_match` backtracked catastrophically on
# patterns of many stars.
def test_glob_match_has_no_catastrophic_backtracking() -> None:
    started = time.monotonic()
    assert not glob_match("*a" * 10 + "b", "a" * 40)
    assert not glob_match("*?" * 30 + "z", "y" * 200)
    # It took 9 s before; a generous bound that cannot flake on a loaded machine.
    assert time.monotonic() - started < 1.0
