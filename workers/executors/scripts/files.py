"""The file scripts of the protocol: claim a run directory, read a byte range, replace
a small file, archive and unpack, and the SHA-256 manifest; the exclude patterns they
share."""

from __future__ import annotations

import re
import secrets as _secrets
from collections.abc import Sequence
from typing import Final

from schemas.protocol import CLAIM_FILE

from ..errors import InvalidArgument, ProtocolError
from .common import READ_FILE, quote

__all__ = [
    "MANIFEST_OPENSSL_ABOVE",
    "archive_script",
    "check_exclude",
    "check_owner",
    "claim_script",
    "manifest_script",
    "parse_claim",
    "parse_size_answer",
    "put_file_script",
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


def claim_script(dir: str, owner: str) -> str:
    """A script that claims `dir` for `owner`: creates it and its parents, then
    `.claim` exclusively (a hard link of a complete temporary file, so a reader never
    sees a partial owner). Prints `claimed` when the claim is `owner`'s (new or
    already), `taken` when another owner holds it; then nothing was changed."""
    check_owner(owner)
    token = _secrets.token_hex(6)
    return f"""
rw_dir={quote(dir)}
rw_owner={quote(owner)}
mkdir -p -- "$rw_dir" || exit 3
rw_tmp="$rw_dir/{CLAIM_FILE}.tmp.$$.{token}"
printf '%s\\n' "$rw_owner" > "$rw_tmp" || exit 3
if ln -- "$rw_tmp" "$rw_dir/{CLAIM_FILE}" 2>/dev/null; then
  rm -f -- "$rw_tmp"; echo claimed; exit 0
fi
if [ ! -e "$rw_dir/{CLAIM_FILE}" ] &&
  (set -C; cat -- "$rw_tmp" > "$rw_dir/{CLAIM_FILE}") 2>/dev/null; then
  rm -f -- "$rw_tmp"; echo claimed; exit 0
fi
rm -f -- "$rw_tmp"
rw_cur=; IFS= read -r rw_cur < "$rw_dir/{CLAIM_FILE}" || :
if [ "$rw_cur" = "$rw_owner" ]; then echo claimed; else echo taken; fi
"""


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


def read_range_script(path: str, offset: int, limit: int) -> str:
    """A script printing at most `limit` bytes of `path` from byte `offset`: nothing
    for a missing file; exit 3 (`<path> is not a regular file`) for anything else
    that is not a regular file, a symbolic link included. The read never blocks and
    never follows a link (`rw_read`)."""
    if offset < 0 or limit < 0:
        raise InvalidArgument("offset and limit are non-negative")
    return (
        READ_FILE
        + f"""
rw_path={quote(path)}
[ -e "$rw_path" ] || [ -h "$rw_path" ] || exit 0
if [ ! -f "$rw_path" ] || [ -h "$rw_path" ]; then
  printf '%s is not a regular file\\n' "$rw_path" >&2; exit 3
fi
rw_read "$rw_path" {limit} {offset}
"""
    )


def put_file_script(path: str, parent: str, content: str) -> str:
    """A script that replaces `path` (in the directory `parent`, created if needed)
    with `content` through a rename from a temporary name unique to this writer
    (shell pid and a random token), so a reader sees the old or the new content,
    never a part. Whatever is at `path` is replaced, never followed: a symbolic link
    or a FIFO is renamed over (`mv -T`: never into a directory a link points to), and
    a directory there (a job's, in a protocol file's place) is removed first. Exit 3
    when it cannot be replaced."""
    token = _secrets.token_hex(6)
    return f"""
rw_path={quote(path)}
[ -d {quote(parent)} ] || mkdir -p -- {quote(parent)} || exit 3
rw_tmp="$rw_path.rw-tmp.$$.{token}"
if [ -d "$rw_path" ] && [ ! -h "$rw_path" ]; then rm -rf -- "$rw_path" 2>/dev/null; fi
if printf '%s' {quote(content)} > "$rw_tmp" && mv -fT -- "$rw_tmp" "$rw_path"; then exit 0; fi
rm -f -- "$rw_tmp"
printf 'cannot replace %s\\n' "$rw_path" >&2
exit 3
"""


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


def _find_args(excludes: Sequence[str]) -> str:
    if not excludes:
        return ""
    names = " -o ".join(f"-name {quote(check_exclude(p))}" for p in excludes)
    return f"\\( {names} \\) -prune -o"


_LINKED: Final = """
rw_linked() {
  rw_rest=$1; rw_pre=.
  while :; do
    case $rw_rest in */*) ;; *) return 1 ;; esac
    rw_pre="$rw_pre/${rw_rest%%/*}"; rw_rest=${rw_rest#*/}
    if [ -h "$rw_pre" ] || [ ! -d "$rw_pre" ]; then return 0; fi
  done
}
"""
"""Defines `rw_linked ENTRY`: true when a directory on the way to ENTRY (a safe
relative path) is a symbolic link or not a directory; such an entry counts as
missing (`find` would follow the link), on every executor alike."""


def _entries_loop(root: str, entries: Sequence[str], body: str, after: str = "") -> str:
    """The loop running `body` for each entry of `root` there (`$rw_e`), `after`
    appended to its `done` (a pipe to what reads the loop's output)."""
    words = " ".join(quote(e) for e in entries)
    return f"""{_LINKED}
rw_root={quote(root)}
if [ ! -d "$rw_root" ]; then printf '%s does not exist\\n' "$rw_root" >&2; exit 3; fi
cd -- "$rw_root" || exit 3
rw_main=$$
for rw_e in {words}; do
  [ -e "./$rw_e" ] || [ -h "./$rw_e" ] || continue
  if rw_linked "$rw_e"; then continue; fi
{body}
done{after}
"""


MANIFEST_OPENSSL_ABOVE: Final = 4 * 1024 * 1024
"""Files larger than this many bytes are hashed by `openssl dgst` where it works: one
process a file, worth it once the file takes longer to hash than a process to start."""
_EMPTY_SHA256: Final = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def manifest_script(root: str, entries: Sequence[str], exclude: Sequence[str]) -> str:
    """A script printing `<sha256 hex>  ./<path>` NUL-terminated records for every
    regular file under `entries` of `root`, names matching an `exclude` pattern left
    out at any depth, symbolic links not followed. Exit 3 when `root` is not a
    directory. Each file is read once. Files above [`MANIFEST_OPENSSL_ABOVE`] go to
    `openssl dgst -sha256` where it answers correctly (its SHA-256 uses the CPU's
    SHA instructions: 4x coreutils' `sha256sum` measured on x86 with SHA-NI, which
    made the manifest slower than a 1 GiB download over SSH); the others to
    `sha256sum -z` where it exists (GNU), else to one `sha256sum` a file (busybox)."""
    if not entries:
        return "exit 0\n"
    prune = _find_args(exclude)
    big = MANIFEST_OPENSSL_ABOVE
    body = f"""
  if [ -n "$rw_o" ]; then
    find "./$rw_e" {prune} -type f -size +{big}c -exec sh -c '
      for f do h=$(openssl dgst -sha256 -r < "$f") || exit 4
        printf "%s  %s\\0" "${{h%% *}}" "$f"; done
    ' rw {{}} + || exit 4
  fi
  if [ -n "$rw_z" ]; then
    {{ find "./$rw_e" {prune} -type f $rw_small -print0 || kill -s TERM "$rw_main"; }} |
      xargs -0 -r sha256sum -z -- || exit 4
  else
    find "./$rw_e" {prune} -type f $rw_small -exec sh -c '
      for f do h=$(sha256sum < "$f") || exit 4; printf "%s  %s\\0" "${{h%% *}}" "$f"; done
    ' rw {{}} + || exit 4
  fi"""
    head = f"""if printf '' | sha256sum -z >/dev/null 2>&1; then rw_z=1; else rw_z=; fi
case $(printf '' | openssl dgst -sha256 -r 2>/dev/null) in
  "{_EMPTY_SHA256} "*) rw_o=1; rw_small="-size -{big + 1}c" ;;
  *) rw_o=; rw_small= ;;
esac
"""
    return head + _entries_loop(root, entries, body)


def size_script(root: str, entries: Sequence[str], exclude: Sequence[str]) -> str:
    """A read-only script printing the total size in bytes of the regular files a
    download of `entries` of `root` would bring (names matching an `exclude` pattern
    left out at any depth, links not followed, an entry with a link on its way
    missing), as one decimal line, from the directory entries alone (no file is
    read). Prints `unknown` where `find` has no `-printf` (not GNU find). Exit 3 when
    `root` is not a directory. Names never reach the output, so none can forge it."""
    if not entries:
        return "echo 0\n"
    prune = _find_args(exclude)
    head = "find / -maxdepth 0 -printf '' >/dev/null 2>&1 || { echo unknown; exit 0; }\n"
    body = f'  find "./$rw_e" {prune} -type f -printf \'%s\\n\' || kill -s TERM "$rw_main"'
    total = " | awk '{ s += $1 } END { printf \"%.0f\\n\", s }' || exit 4"
    return head + _entries_loop(root, entries, body, total)


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


def archive_script(root: str, entries: Sequence[str], exclude: Sequence[str]) -> str:
    """A script writing to stdout a tar stream of `entries` of `root` (directories,
    files and symbolic links, links not followed, an entry with a link on its way
    left out), names matching an `exclude` pattern left out at any depth. A file
    with several hard links is archived in full under each name
    (`--hard-dereference`): a download refuses hard link members, and the manifest
    lists each name as a regular file. Exit 3 when `root` is not a directory. Needs
    GNU tar (`--null -T -`)."""
    if not entries:
        return "exit 0\n"
    prune = _find_args(exclude)
    body = f'  find "./$rw_e" {prune} -print0 || kill -s TERM "$rw_main"'
    tar = " | tar --null --no-recursion --hard-dereference -T - -cf - || exit 4"
    return _entries_loop(root, entries, body, tar)


def unpack_script(remote: str) -> str:
    """A script that creates `remote` and unpacks the tar stream on its stdin there,
    without restoring owners."""
    return f"""
rw_dest={quote(remote)}
mkdir -p -- "$rw_dest" || exit 3
tar -xf - -o -C "$rw_dest" || exit 4
"""
