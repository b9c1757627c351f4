"""Reading a run directory on this machine as the target's scripts read theirs, but
through directory descriptors: the entries' directories, files and links, excluded
names pruned, links never followed, not even in an entry's own path, and no file
opened through a name a job swapped for a link or a FIFO meanwhile. The local
executor's download (`local.py`) and its manifest ([`local_manifest`]) walk it."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from schemas import InvalidPath, safe_relpath

from .digest import FileDigest, glob_match
from .errors import CommandError, InvalidArgument, IoError
from .scripts import check_exclude

__all__ = [
    "Node",
    "check_entries",
    "local_manifest",
    "open_regular",
    "open_root",
    "walk_entries",
]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the look opens without waiting for a writer.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK: Final = 1024 * 1024


@dataclass(frozen=True)
class Node:
    """A directory, regular file or symbolic link found under an entry. `dir_fd` (its
    directory) is valid only until the walk moves on."""

    path: str
    """Relative to the walked root."""
    dir_fd: int
    name: str
    info: os.stat_result
    """Its `lstat`."""

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.info.st_mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.info.st_mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.info.st_mode)


def check_entries(entries: Sequence[str], exclude: Sequence[str]) -> None:
    """Raises [`InvalidArgument`] for an entry that is not a safe relative path or a
    pattern outside the executors' glob syntax."""
    try:
        for entry in entries:
            safe_relpath(entry)
    except InvalidPath as error:
        raise InvalidArgument(str(error)) from error
    for pattern in exclude:
        check_exclude(pattern)


def open_root(root: Path, action: str) -> int:
    """A descriptor of the directory `root` (the caller closes it).

    Raises:
        CommandError: (`action`, message `<root> does not exist`) when `root` is not
            a directory.
        IoError: when it cannot be opened otherwise.
    """
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError) as error:
        raise CommandError(action, f"{root} does not exist") from error
    except OSError as error:
        raise IoError(root, error) from error


def _entry_parent(root_fd: int, entry: str) -> int | None:
    """A new descriptor of the directory holding `entry`, reached from `root_fd`
    without following links; None when a component on the way is missing, a link or
    not a directory (the entry is then not there)."""
    fd = os.dup(root_fd)
    for part in entry.split("/")[:-1]:
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as error:
            if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                os.close(fd)
                raise
            child = -1
        os.close(fd)
        if child < 0:
            return None
        fd = child
    return fd


def walk_entries(
    root_fd: int, entries: Sequence[str], exclude: Sequence[str], *, skip_vanished: bool = False
) -> Iterator[Node]:
    """Every directory, regular file and symbolic link under `entries` of the
    directory `root_fd`, a directory before its content, names matching an `exclude`
    pattern pruned at any depth (an entry's own name too), missing entries skipped,
    links never followed (an entry with a link on its way counts as missing);
    device files, FIFOs and sockets left out. With `skip_vanished`, a directory gone
    (or swapped) between its listing and its reading is left out too.

    Raises:
        OSError: when a directory cannot be read.
    """

    def excluded(name: str) -> bool:
        return any(glob_match(p, name) for p in exclude)

    for entry in entries:
        name = entry.rpartition("/")[2]
        if excluded(name):
            continue
        parent = _entry_parent(root_fd, entry)
        if parent is None:
            continue
        try:
            yield from _walk_entry(parent, entry, name, excluded, skip_vanished)
        finally:
            os.close(parent)


def _walk_entry(
    parent: int, entry: str, name: str, excluded: Callable[[str], bool], skip_vanished: bool
) -> Iterator[Node]:
    try:
        top = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        if stat.S_ISREG(top.st_mode) or stat.S_ISLNK(top.st_mode):
            yield Node(entry, parent, name, top)
        return
    yield Node(entry, parent, name, top)
    base = entry.rpartition("/")[0]

    def fail(error: OSError) -> None:
        if skip_vanished and error.errno in (errno.ENOENT, errno.ENOTDIR):
            return
        raise error

    # fwalk holds a descriptor of each directory it lists and never enters a link.
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(
        name, onerror=fail, follow_symlinks=False, dir_fd=parent
    ):
        relative = f"{base}/{dirpath}" if base else dirpath
        kept: list[str] = []
        for child in sorted([*dirnames, *filenames]):
            if excluded(child):
                continue
            try:
                info = os.stat(child, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            node = Node(f"{relative}/{child}", dir_fd, child, info)
            if node.is_dir:
                kept.append(child)
                yield node
            elif node.is_file or node.is_link:
                yield node
        # Links to directories are among fwalk's directories: yielded as links above.
        dirnames[:] = [d for d in dirnames if d in kept]


def open_regular(node: Node) -> int | None:
    """A read-only descriptor of the regular file `node` (the caller closes it); None
    when it is no longer a regular file there (gone, or replaced by a link or a
    FIFO since it was listed).

    Raises:
        OSError: when it cannot be opened otherwise.
    """
    try:
        fd = os.open(node.name, _READ_FLAGS, dir_fd=node.dir_fd)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _sha256_fd(fd: int) -> str:
    digest = hashlib.sha256()
    with open(fd, "rb", closefd=False) as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def local_manifest(
    root: Path, entries: Sequence[str], exclude: Sequence[str] = ()
) -> list[FileDigest]:
    """Every regular file under `entries` of the local directory `root` with its
    SHA-256, as [`manifest_script`](scripts.manifest_script) computes it on a target:
    missing entries skipped, excluded names left out at any depth, links not
    followed (nor on an entry's way), sorted by path. Each file is read once,
    through a descriptor opened without following links.

    Raises:
        CommandError: (action `manifest`) when `root` is not a directory.
        InvalidArgument: for an entry that would leave `root` or a bad pattern.
        IoError: when a file or directory cannot be read.
    """
    check_entries(entries, exclude)
    root_fd = open_root(root, "manifest")
    digests: dict[str, FileDigest] = {}
    try:
        for node in walk_entries(root_fd, entries, exclude):
            if not node.is_file:
                continue
            fd = open_regular(node)
            if fd is None:
                continue  # gone meanwhile: as a target's find would miss it
            try:
                digests[node.path] = FileDigest(node.path, _sha256_fd(fd))
            finally:
                os.close(fd)
    except OSError as error:
        raise IoError(error.filename or root, error) from error
    finally:
        os.close(root_fd)
    return sorted(digests.values())
