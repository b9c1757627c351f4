"""`schemas.paths`: relative paths inside a run directory, on examples and as properties."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import InvalidPath, SchemaError, join_run_path, safe_relpath


@pytest.mark.parametrize(
    "path",
    [
        "a",
        "output/checkpoint-120",
        "a/b/c",
        "sp ace",
        "quo'te",
        "new\nline",
        "$(touch PWNED)",
        "-leading",
        "...",
        "a/..b",
        "a./b",
        "ünï",
    ],
)
def test_safe_relpath_accepts(path: str) -> None:
    assert safe_relpath(path) == path


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/",
        "/etc/passwd",
        "..",
        ".",
        "../x",
        "a/..",
        "a/../b",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        "//a",
        "a\0b",
    ],
)
def test_safe_relpath_refuses(path: str) -> None:
    with pytest.raises(InvalidPath):
        safe_relpath(path)


def test_join_run_path() -> None:
    assert join_run_path("/w/r1", "snapshot.json") == "/w/r1/snapshot.json"
    assert join_run_path("/w/r1/", "output/x") == "/w/r1/output/x"
    assert join_run_path("/", "x") == "/x"
    with pytest.raises(InvalidPath):
        join_run_path("w/r1", "x")
    with pytest.raises(InvalidPath):
        join_run_path("/w/r1", "../x")
    assert issubclass(InvalidPath, SchemaError)


# --- properties -------------------------------------------------------------------


components = st.text(min_size=1, max_size=12).filter(
    lambda c: "\0" not in c and "/" not in c and c not in (".", "..")
)
relative_paths = st.lists(components, min_size=1, max_size=3).map("/".join)
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
