"""What an upload copies, read so that it cannot be raced: the directory that was
checked is opened one component at a time from `/` without following a link, and
walked through descriptors ([`walk_entries`](localtree.walk_entries): links never
followed, each file opened without following one and checked regular). A directory
swapped for a link to elsewhere (the secrets directory) after the check is copied as
that link, never as what it points to; a root swapped on its way fails the upload.
Both executors' uploads use it: into a local run directory ([`put_local`]) and into
the tar stream an SSH target unpacks ([`add_to_tar`]).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from .errors import CommandError, InvalidArgument, IoError
from .localtree import Node, open_regular, walk_entries

__all__ = ["add_to_tar", "open_checked", "put_local", "upload_nodes"]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK: Final = 1024 * 1024


def open_checked(path: Path, action: str) -> int:
    """A descriptor of the directory `path` (absolute, without links: as a check
    resolved it), opened one component at a time from `/` without following a link
    (the caller closes it).

    Raises:
        InvalidArgument: `path` is not absolute.
        CommandError: (`action`) a component is now a link, a file or missing: the
            path is no longer the directory that was checked.
        IoError: it cannot be opened otherwise.
    """
    if not path.is_absolute():
        raise InvalidArgument(f"{action}: {path} is not an absolute path")
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in path.parts[1:]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    raise CommandError(
                        action, f"{path} is no longer the directory that was checked"
                    ) from error
                raise IoError(path, error) from error
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def upload_nodes(root_fd: int, skip: Sequence[str]) -> Iterator[Node]:
    """Every directory, regular file and link under the directory `root_fd`, its
    top-level names in `skip` left out, a directory before its content; what is gone
    by the time it is read is left out (a project changing while it is uploaded).

    Raises:
        OSError: a directory cannot be read.
    """
    left_out = set(skip)
    names = sorted(name for name in os.listdir(root_fd) if name not in left_out)
    yield from walk_entries(root_fd, names, (), skip_vanished=True)


def put_local(node: Node, dest: Path) -> None:
    """Copies `node` to `dest` on this machine (a directory in the caller's run
    directory, not the job's yet): a directory made, a file's bytes, mode and times,
    a link as a link; whatever `dest` held replaced (a directory merged). A file gone
    or swapped since it was listed is left out.

    Raises:
        OSError: when it cannot be read or written.
    """
    mode = stat.S_IMODE(node.info.st_mode)
    if node.is_dir:
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            dest.unlink()
        dest.mkdir(exist_ok=True)
        os.chmod(dest, mode | stat.S_IRWXU)
        return
    if node.is_link:
        target = _link_target(node)
        if target is None:
            return
        _clear(dest)
        os.symlink(target, dest)
        return
    source = open_regular(node)
    if source is None:
        return
    try:
        _clear(dest)
        out = os.open(dest, _NEW_FILE, mode)
        with open(source, "rb", closefd=False) as reading, open(out, "wb") as writing:
            shutil.copyfileobj(reading, writing, _CHUNK)  # every byte, or an error
            os.fchmod(out, mode)  # as created, the umask applied: the file's own mode
        info = os.fstat(source)
        os.utime(dest, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
    finally:
        os.close(source)


def _link_target(node: Node) -> str | None:
    """What the link `node` holds; None when it is gone or no longer a link."""
    try:
        return os.readlink(node.name, dir_fd=node.dir_fd)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.EINVAL):
            return None
        raise


def _clear(dest: Path) -> None:
    """Removes a file or link at `dest` (a directory there is an error)."""
    with contextlib.suppress(FileNotFoundError):
        if dest.is_dir() and not dest.is_symlink():
            raise IsADirectoryError(errno.EISDIR, "a directory is in the way", str(dest))
        dest.unlink()


def add_to_tar(tar: tarfile.TarFile, node: Node) -> None:
    """Adds `node` to `tar` under its relative path: a directory, a file's bytes read
    through one descriptor (its size from that descriptor), a link as a link. A file
    gone or swapped since it was listed is left out.

    Raises:
        OSError: when it cannot be read (or changes size while it is read).
    """
    info = tarfile.TarInfo(node.path)
    info.mode = stat.S_IMODE(node.info.st_mode)
    info.mtime = int(node.info.st_mtime)
    if node.is_dir:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        return
    if node.is_link:
        target = _link_target(node)
        if target is not None:
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
        return
    source = open_regular(node)
    if source is None:
        return
    with open(source, "rb") as handle:
        opened = os.fstat(handle.fileno())
        info.size = opened.st_size
        info.mtime = int(opened.st_mtime)
        tar.addfile(info, handle)
