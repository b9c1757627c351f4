"""Writing a downloaded tree under a local root without ever following a link: every
path component is opened or made relative to its parent's descriptor, with
`O_NOFOLLOW`, so nothing a target sends (names, links, their order) can make a
write land outside the root. Both downloads use it: the tar extraction of the
script executors (`untar.py`) and the local executor's copy (`local.py`).

The rules, the same for every executor:

- A regular file is created anew (`O_CREAT|O_EXCL|O_NOFOLLOW`), hashed as it is
  written; a non-directory already at its name is removed first (the link itself,
  never its target); a directory there is refused.
- A symbolic link is kept when its target stays inside the tree ([`stays_inside`]);
  otherwise it is not made, and is recorded as skipped (path and target).
- A directory is made component by component; a component that this tree wrote as
  a file or a link, or that is a skipped link, cannot be a directory: a member
  below it is refused. A non-directory left there by an earlier attempt is
  replaced.
- A refusal is [`UnsafeArchive`]; nothing is written outside the root, ever.
- With a `charge` ([`Charge`]), every chunk of a file's content is charged before it
  is written; what the charge raises stops the tree there, unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .digest import Charge, FileDigest, Readable, copy_hashed
from .errors import UnsafeArchive

__all__ = ["Downloaded", "Link", "SafeTree", "stays_inside"]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINK_TARGET_BYTES: Final = 4095
"""Longest link target Linux stores (PATH_MAX - 1); a longer one is no real link."""
_MTIME_LIMIT_NS: Final = 2**62
"""Modification times at or beyond this many ns either side of 1970 are written as 0:
no file has one, and the kernel refuses them."""


@dataclass(frozen=True, order=True)
class Link:
    """A symbolic link of a downloaded tree: its path relative to the root, and its
    target as the target machine holds it (never resolved here)."""

    path: str
    target: str


@dataclass(frozen=True)
class Downloaded:
    """What a download wrote, each list sorted by path."""

    files: list[FileDigest] = field(default_factory=list)
    """Every regular file with the SHA-256 of the bytes written."""
    links: list[Link] = field(default_factory=list)
    """Symbolic links made, their targets inside the tree."""
    skipped_links: list[Link] = field(default_factory=list)
    """Symbolic links not made: their target is absolute or leaves the tree."""


def stays_inside(path: str, target: str) -> bool:
    """Whether the link at `path` (a safe relative path in the tree) with `target`
    resolves inside the tree, lexically, from the link's own directory: `target` is
    relative, and its `..` components all come first and do not climb above the
    root. A `..` after a name counts as leaving: the name may itself be a link
    (`b -> ../../..` makes `b/../x` leave, though it reads as `x`). `.` and empty
    components are ignored. Links kept by this rule can only lead to places inside
    the tree, however they are chained: each climbs from a real directory and then
    only descends."""
    if not target or target.startswith("/"):
        return False
    climbs = 0
    named = False
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if named:
                return False
            climbs += 1
        else:
            named = True
    return climbs <= path.count("/")


def _check_target(path: str, target: str) -> None:
    if not target or "\0" in target or len(os.fsencode(target)) > MAX_LINK_TARGET_BYTES:
        raise UnsafeArchive(f"link {path[:200]!r}: its target is no link target")


def _mtime_ns(mtime_ns: int) -> int:
    return mtime_ns if -_MTIME_LIMIT_NS < mtime_ns < _MTIME_LIMIT_NS else 0


class SafeTree:
    """A tree being written under the local directory `root` (made, with its parents,
    at the first write: a download of nothing creates nothing). Paths given to it are
    safe relative paths (`schemas.safe_relpath`), checked by the caller. Not thread
    safe; close it (or use it as a context manager) to release its descriptors.

    Methods raise [`UnsafeArchive`] for what the rules refuse, `OSError` when the
    local file system fails (the caller translates it), and whatever `charge` raises
    (see the module docstring)."""

    def __init__(self, root: Path, charge: Charge | None = None) -> None:
        self._root = root
        self._charge = charge
        self._root_fd = -1
        self._parent_path: str | None = None
        self._parent_fd = -1
        self._files: dict[str, str] = {}
        self._links: dict[str, str] = {}
        self._skipped: dict[str, str] = {}

    def __enter__(self) -> SafeTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Releases the descriptors held; the records stay readable."""
        self._forget_parent()
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def result(self) -> Downloaded:
        """What was written so far, sorted."""
        return Downloaded(
            files=sorted(FileDigest(p, h) for p, h in self._files.items()),
            links=sorted(Link(p, t) for p, t in self._links.items()),
            skipped_links=sorted(Link(p, t) for p, t in self._skipped.items()),
        )

    # --- the operations ----------------------------------------------------------

    def directory(self, path: str) -> None:
        """Makes the directory `path` and its parents (kept when already there)."""
        self._drop(path)
        fd = self._open_dir(path, create=True)
        assert fd is not None  # made when missing
        os.close(fd)

    def file(self, path: str, source: Readable, mode: int, mtime_ns: int) -> str:
        """Writes everything `source` holds into the new regular file `path`, its
        parents made, and returns its SHA-256 (lowercase hex), computed from the
        bytes as written. Its mode becomes `mode` without group/other write or the
        set-id and sticky bits, plus owner read and write; its access and
        modification times `mtime_ns` (nanoseconds since 1970; an impossible value
        becomes 0)."""
        parent, name = self._parent(path, create=True)
        assert parent is not None  # made when missing
        fd = self._create(parent, name, path)
        with open(fd, "wb") as out:
            sha256 = copy_hashed(source, out, charge=self._charge)
            out.flush()
            os.fchmod(fd, (mode & 0o755) | 0o600)
            when = _mtime_ns(mtime_ns)
            os.utime(fd, ns=(when, when))
        self._drop(path)
        self._files[path] = sha256
        return sha256

    def link(self, path: str, target: str) -> bool:
        """Makes the symbolic link `path -> target` when `target` stays inside the tree
        ([`stays_inside`]) and returns True; otherwise removes whatever non-directory
        is at `path`, records the link as skipped and returns False. A directory at
        `path` is refused either way."""
        _check_target(path, target)
        keep = stays_inside(path, target)
        parent, name = self._parent(path, create=keep)
        self._drop(path)
        if not keep:
            if parent is not None:
                self._clear(parent, name, path)
            self._skipped[path] = target
            return False
        assert parent is not None  # made when missing
        try:
            os.symlink(target, name, dir_fd=parent)
        except FileExistsError:
            self._clear(parent, name, path)
            os.symlink(target, name, dir_fd=parent)
        self._links[path] = target
        return True

    def leave_out(self, path: str) -> None:
        """Records that `path` is not part of the tree (a device file, a FIFO): removes
        a non-directory written there before, if any."""
        parent, name = self._parent(path, create=False)
        self._drop(path)
        if parent is not None:
            self._clear(parent, name, path)

    # --- descriptors -------------------------------------------------------------

    def _drop(self, path: str) -> None:
        self._files.pop(path, None)
        self._links.pop(path, None)
        self._skipped.pop(path, None)

    def _clear(self, parent: int, name: str, path: str) -> None:
        """Removes the non-directory `name` of `parent`, if any; refuses a directory."""
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            raise UnsafeArchive(f"{path[:200]!r} replaces a directory")
        os.unlink(name, dir_fd=parent)

    def _create(self, parent: int, name: str, path: str) -> int:
        try:
            return os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            self._clear(parent, name, path)
            return os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=parent)

    def _root_dir(self, create: bool) -> int | None:
        if self._root_fd < 0:
            if create:
                # The root is this machine's own choice, not the target's: its path
                # may hold links.
                self._root.mkdir(parents=True, exist_ok=True)
            try:
                self._root_fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                if create:
                    raise
                return None
        return self._root_fd

    def _forget_parent(self) -> None:
        if self._parent_fd >= 0:
            os.close(self._parent_fd)
        self._parent_fd = -1
        self._parent_path = None

    def _parent(self, path: str, create: bool) -> tuple[int | None, str]:
        """The descriptor of the directory holding `path` (cached: a stream writes
        one directory's members in a row) and `path`'s last component; None for a
        missing directory when `create` is false."""
        head, _, name = path.rpartition("/")
        if head != self._parent_path or self._parent_fd < 0:
            fd = self._open_dir(head, create)
            if fd is None:
                return None, name
            self._forget_parent()
            self._parent_fd, self._parent_path = fd, head
        return self._parent_fd, name

    def _open_dir(self, path: str, create: bool) -> int | None:
        """A new descriptor of the directory `path` ("" is the root), reached one
        component at a time without following links, made when missing if `create`;
        None when missing otherwise."""
        root = self._root_dir(create)
        if root is None:
            return None
        fd = os.dup(root)
        if not path:
            return fd
        done = ""
        try:
            for part in path.split("/"):
                done = f"{done}/{part}" if done else part
                if done in self._skipped:
                    raise UnsafeArchive(f"{path[:200]!r} lies below the link {done[:200]!r}")
                if done in self._links:
                    raise UnsafeArchive(f"{path[:200]!r} lies below the link {done[:200]!r}")
                if done in self._files:
                    raise UnsafeArchive(f"{path[:200]!r} lies below the file {done[:200]!r}")
                child = self._child_dir(fd, part, done, create)
                os.close(fd)
                fd = child
                if fd < 0:
                    return None
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        return fd

    def _child_dir(self, parent: int, name: str, path: str, create: bool) -> int:
        """The directory `name` of `parent` opened (-1 when missing and not
        `create`): made when missing; a non-directory there (left by an earlier
        attempt: this tree's own are refused before) is removed and replaced."""
        for _ in range(2):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    return -1
            except OSError as error:
                if error.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                if not create:
                    return -1
                os.unlink(name, dir_fd=parent)
            with contextlib.suppress(FileExistsError):  # made meanwhile: opened next
                os.mkdir(name, 0o777, dir_fd=parent)
        raise UnsafeArchive(f"{path[:200]!r} cannot be made a directory")
