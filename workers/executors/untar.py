"""A download's tar stream, from a target that may be hostile, written into a
[`SafeTree`]: every member's name checked, its kind decided here (tarfile's own
extraction is never used), extended headers bounded in size."""

from __future__ import annotations

import tarfile
from typing import IO, Any, Final

from schemas import InvalidPath, safe_relpath

from .errors import UnsafeArchive
from .safetree import SafeTree

__all__ = ["MAX_HEADER_BYTES", "TAR_BUFSIZE", "extract_stream", "member_path"]

TAR_BUFSIZE: Final = 64 * 1024
"""tarfile's read size on a download stream, in bytes (its default is 10 KiB; beyond
a few hundred KiB its buffer joins and slices leave the CPU cache and cost more than
the hashing)."""
MAX_HEADER_BYTES: Final = 1024 * 1024
"""Largest extended header (a GNU long name or link, a pax header) taken, in bytes:
tarfile reads one whole into memory. A name is at most a few KiB."""


def member_path(name: str) -> str:
    """The path an archive member names, relative to the destination (`./a/b` ->
    `a/b`), or [`UnsafeArchive`] when it is absolute or holds `.`/`..` components."""
    relative = name[2:] if name.startswith("./") else name
    try:
        return safe_relpath(relative)
    except InvalidPath as error:
        raise UnsafeArchive(f"archive member {name[:200]!r}: {error}") from error


class _BoundedTarInfo(tarfile.TarInfo):
    """A member header that refuses, before tarfile reads them, what would let a
    target fill this process's memory: an extended header above
    [`MAX_HEADER_BYTES`], global pax headers (kept for the whole stream), and GNU
    sparse members (their maps are read whole); the target's GNU tar writes none of
    them for the archive script's trees."""

    def _proc_member(self, tarfile_: Any) -> Any:
        kind = self.type
        if kind in (tarfile.GNUTYPE_SPARSE, tarfile.XGLTYPE):
            raise UnsafeArchive(f"archive member {self.name[:200]!r}: type {kind!r} refused")
        extended = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE)
        if (kind in extended or kind == tarfile.SOLARIS_XHDTYPE) and self.size > MAX_HEADER_BYTES:
            raise UnsafeArchive(f"an extended header of {self.size} bytes")
        return getattr(super(), "_proc_member")(tarfile_)  # noqa: B009 # not in the stubs

    def _proc_gnusparse_10(self, next_: Any, pax_headers: Any, tarfile_: Any) -> Any:
        raise UnsafeArchive(f"archive member {next_.name[:200]!r}: a GNU sparse map")


def _mtime_ns(member: tarfile.TarInfo) -> int:
    try:
        return int(member.mtime * 1_000_000_000)
    except (ValueError, OverflowError, TypeError):
        return 0  # NaN or infinite in a pax header: no time the kernel takes


def extract_stream(stream: IO[bytes], tree: SafeTree) -> None:
    """Writes every member of the tar stream `stream` into `tree`: directories,
    regular files (hashed as written), symbolic links (kept or skipped by the tree's
    rule); device files and FIFOs are left out (a manifest lists regular files
    only).

    Raises:
        UnsafeArchive: at the first member the tree refuses, a name that is absolute
            or holds `.`/`..` components, a hard link (the archive script writes
            every hard-linked file in full), a member of another kind, or an
            oversized header; nothing was written outside the tree.
        tarfile.TarError: for a broken stream.
        OSError: when writing fails.
    """
    with tarfile.open(
        fileobj=stream, mode="r|", bufsize=TAR_BUFSIZE, tarinfo=_BoundedTarInfo
    ) as tar:
        for member in tar:
            path = member_path(member.name)
            if member.isreg():
                source = tar.extractfile(member)
                assert source is not None  # a regular member always has data
                tree.file(path, source, member.mode, _mtime_ns(member))
            elif member.isdir():
                tree.directory(path)
            elif member.issym():
                tree.link(path, member.linkname)
            elif member.ischr() or member.isblk() or member.isfifo():
                tree.leave_out(path)
            elif member.islnk():
                raise UnsafeArchive(
                    f"archive member {member.name[:200]!r}: a hard link "
                    f"(to {member.linkname[:200]!r})"
                )
            else:
                raise UnsafeArchive(
                    f"archive member {member.name[:200]!r}: type {member.type!r} refused"
                )
