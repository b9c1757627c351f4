"""Paths relative to a run directory: the only way a name from outside (a proof, a
request for a download entry, a manifest line) becomes a path on a target or here."""

from __future__ import annotations

from .errors import InvalidPath
from .job import check_absolute_path

__all__ = ["join_run_path", "safe_relpath"]


def safe_relpath(path: str) -> str:
    """Returns `path` when it is a normalized relative path that stays inside the
    directory it is relative to, else raises.

    Accepted: one or more components separated by single `/`, none empty, `.` or
    `..`, no NUL byte, not starting with `/`, no trailing `/`. Any other character
    (spaces, quotes, newlines, `$`, a leading `-`) is accepted and quoted where it
    reaches a shell.

    Raises:
        InvalidPath: naming the path (repr, cut to 200 characters) and the rule.
    """
    shown = repr(path[:200])
    if not path:
        raise InvalidPath("an empty path names nothing")
    if "\0" in path:
        raise InvalidPath(f"{shown} holds a NUL byte")
    if path.startswith("/"):
        raise InvalidPath(f"{shown} is absolute: a path here is relative to the run directory")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise InvalidPath(f"{shown} would leave the run directory or is not normalized")
    return path


def join_run_path(run_dir: str, relative: str) -> str:
    """`run_dir/relative` after checking that `run_dir` is absolute and `relative` is a
    [`safe_relpath`].

    Raises:
        InvalidPath: when either check fails.
    """
    try:
        check_absolute_path(run_dir)
    except ValueError as error:
        raise InvalidPath(str(error)) from error
    return f"{run_dir.rstrip('/') or ''}/{safe_relpath(relative)}"
