"""The file scripts of the protocol: claim a run directory, read a byte range, replace
a small file, archive and unpack, and the SHA-256 manifest; the exclude patterns they
share. Their text is in `sh/` (`claim.sh`, `read_range.sh`, `put_file.sh`,
`unpack.sh`, and `entries.sh` with `size.sh`, `archive.sh`, `manifest.sh`); paths,
owners, entries and patterns are their arguments."""

from __future__ import annotations

import re
import secrets as _secrets
from collections.abc import Sequence
from typing import Final

from ..errors import InvalidArgument, ProtocolError
from .common import Script, sh

__all__ = [
    "MANIFEST_OPENSSL_ABOVE",
    "archive_script",
    "check_exclude",
    "check_owner",
    "claim_script",
    "manifest_script",
    "parse_claim",
    "parse_put_files",
    "parse_size_answer",
    "put_file_script",
    "put_files_script",
    "read_range_script",
    "size_script",
    "unpack_script",
]


def check_owner(owner: str) -> str:
    """Returns `owner` when it is one non-empty line without NUL, else raises
    [`InvalidArgument`]."""
    if not owner or any(c in owner for c in "\n\r\0"):
        raise InvalidArgument("a claim owner is one non-empty line")
    return owner


def claim_script(dir: str, owner: str) -> Script:
    """A script that claims `dir` for `owner`: creates it and its parents, then
    `.claim` exclusively (a hard link of a complete temporary file, so a reader never
    sees a partial owner). Prints `claimed` when the claim is `owner`'s (new or
    already), `taken` when another owner holds it; then nothing was changed."""
    check_owner(owner)
    return Script(sh("claim"), (dir, owner, _secrets.token_hex(6)))


def parse_claim(output: bytes) -> bool:
    """Whether a [`claim_script`] run claimed its directory.

    Raises:
        ProtocolError: for any answer but `claimed` or `taken`.
    """
    text = output.decode("utf-8", "replace").strip()
    if text == "claimed":
        return True
    if text == "taken":
        return False
    raise ProtocolError(f"claim answered {text[:80]!r}")


def read_range_script(path: str, offset: int, limit: int) -> Script:
    """A script printing at most `limit` bytes of `path` from byte `offset`: nothing
    for a missing file; exit 3 (`<path> is not a regular file`) for anything else
    that is not a regular file, a symbolic link included, and (`<path> could not be
    read as a regular file`) for one whose read then fails: a job may swap its file
    between the test and the read. The read never blocks and never follows a link
    (`rw_read`)."""
    if offset < 0 or limit < 0:
        raise InvalidArgument("offset and limit are non-negative")
    return Script(sh("read", "read_range"), (path, str(int(limit)), str(int(offset))))


def put_file_script(path: str, parent: str, content: str) -> Script:
    """A script that replaces `path` (in the directory `parent`, created if needed)
    with `content` through a rename from a temporary name unique to this writer
    (shell pid and a random token), so a reader sees the old or the new content,
    never a part. Whatever is at `path` is replaced, never followed: a symbolic link
    or a FIFO is renamed over (`mv -T`: never into a directory a link points to), and
    a directory there (a job's, in a protocol file's place) is removed first. Exit 3
    when it cannot be replaced."""
    return Script(sh("put_file"), (path, parent, _secrets.token_hex(6), content))


def put_files_script(files: Sequence[tuple[str, str]], token: str) -> Script:
    """One script replacing each `(path, content)` of `files`, as [`put_file_script`]
    replaces one (its directory created if needed, a rename from a writer-unique
    name, a directory in its place removed first, a link or FIFO renamed over); a
    file that cannot be replaced never stops the others. It prints, each record
    introduced by `token` (random: no name on the target can forge one), `W <i> ok`
    or `W <i> fail` for each, then `E` ([`parse_put_files`]).

    Raises:
        InvalidArgument: a token that is not alphanumeric.
    """
    if not token.isalnum():
        raise InvalidArgument("the put_files token is alphanumeric")
    args = [token]
    for index, (path, content) in enumerate(files):
        args += [str(index), path, content]
    return Script(sh("put_files"), tuple(args))


def parse_put_files(output: bytes, token: str, count: int) -> list[bool]:
    """Whether each of the `count` files of a [`put_files_script`] run was replaced,
    in order.

    Raises:
        ProtocolError: when the answer is cut short or malformed.
    """
    done: dict[int, bool] = {}
    ended = False
    for line in output.decode("utf-8", "replace").splitlines():
        if not line.strip():
            continue
        words = line.split(" ")
        if words[0] != token:
            raise ProtocolError(f"put_files answer {line[:80]!r}")
        if words[1:] == ["E"]:
            ended = True
            continue
        try:
            if len(words) != 4 or words[1] != "W" or words[3] not in ("ok", "fail"):
                raise ValueError("not a record")
            index = int(words[2])
            if not 0 <= index < count:
                raise ValueError("no such file")
        except ValueError as error:
            raise ProtocolError(f"put_files answer {line[:80]!r}") from error
        done[index] = words[3] == "ok"
    if not ended or len(done) != count:
        raise ProtocolError(f"put_files answered {len(done)} of {count} files")
    return [done[i] for i in range(count)]


_PATTERN_SPECIALS = re.compile(r"[\[\]\\/]")


def check_exclude(pattern: str) -> str:
    """Returns `pattern` when it is a name pattern in the executors' glob syntax: `*`
    (any run of characters) and `?` (one character), every other character literal,
    no `/`, `[`, `]` or `\\`, not empty. Raises [`InvalidArgument`] otherwise."""
    if not pattern or "\0" in pattern or _PATTERN_SPECIALS.search(pattern):
        raise InvalidArgument(
            f"exclude pattern {pattern[:80]!r}: use a name with only * and ? as wildcards"
        )
    return pattern


def _entries_args(
    root: str, entries: Sequence[str], exclude: Sequence[str], *extra: str
) -> tuple[str, ...]:
    """The arguments of a script over `entries` of `root` (`sh/entries.sh`)."""
    patterns = [check_exclude(p) for p in exclude]
    return (root, str(len(entries)), str(len(patterns)), *extra, *entries, *patterns)


MANIFEST_OPENSSL_ABOVE: Final = 4 * 1024 * 1024
"""Files larger than this many bytes are hashed by `openssl dgst` where it works: one
process a file, worth it once the file takes longer to hash than a process to start."""


def manifest_script(root: str, entries: Sequence[str], exclude: Sequence[str]) -> Script:
    """A script printing `<sha256 hex>  ./<path>` NUL-terminated records for every
    regular file under `entries` of `root`, names matching an `exclude` pattern left
    out at any depth, symbolic links not followed. Exit 3 when `root` is not a
    directory. Each file is read once. Files above [`MANIFEST_OPENSSL_ABOVE`] go to
    `openssl dgst -sha256` where it answers correctly (its SHA-256 uses the CPU's
    SHA instructions: 4x coreutils' `sha256sum` measured on x86 with SHA-NI, which
    made the manifest slower than a 1 GiB download over SSH); the others to
    `sha256sum -z` where it exists (GNU), else to one `sha256sum` a file (busybox)."""
    args = _entries_args(root, entries, exclude, str(MANIFEST_OPENSSL_ABOVE))
    return Script(sh("entries", "manifest"), args)


def size_script(root: str, entries: Sequence[str], exclude: Sequence[str]) -> Script:
    """A read-only script printing the total size in bytes of the regular files a
    download of `entries` of `root` would bring (names matching an `exclude` pattern
    left out at any depth, links not followed, an entry with a link on its way
    missing), as one decimal line, from the directory entries alone (no file is
    read). Prints `unknown` where `find` has no `-printf` (not GNU find). Exit 3 when
    `root` is not a directory. Names never reach the output, so none can forge it."""
    return Script(sh("entries", "size"), _entries_args(root, entries, exclude))


def parse_size_answer(output: bytes) -> int | None:
    """The total of a [`size_script`] run; None for `unknown`.

    Raises:
        ProtocolError: for any other answer than one decimal line.
    """
    text = output.decode("ascii", "replace").strip()
    if text == "unknown":
        return None
    if not text.isdecimal() or len(text) > 20:
        raise ProtocolError(f"the size script answered {text[:80]!r}")
    return int(text)


def archive_script(root: str, entries: Sequence[str], exclude: Sequence[str]) -> Script:
    """A script writing to stdout a tar stream of `entries` of `root` (directories,
    files and symbolic links, links not followed, an entry with a link on its way
    left out), names matching an `exclude` pattern left out at any depth. A file
    with several hard links is archived in full under each name
    (`--hard-dereference`): a download refuses hard link members, and the manifest
    lists each name as a regular file. Exit 3 when `root` is not a directory. Needs
    GNU tar (`--null -T -`)."""
    return Script(sh("entries", "archive"), _entries_args(root, entries, exclude))


def unpack_script(remote: str) -> Script:
    """A script that creates `remote` and unpacks the tar stream on its stdin there,
    without restoring owners."""
    return Script(sh("unpack"), (remote,))
