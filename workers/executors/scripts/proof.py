"""The one rule for a proof's checkpoint, on the target: it must resolve, with no
symbolic link on any component of its path, to a non-empty directory inside the run
directory. One script judges a batch of checkpoints (every proof judged in a follow
tick, or the one a deadline or a run's end reads), and the parser of its answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ..errors import InvalidArgument, ProtocolError
from .common import quote

__all__ = ["CHECKPOINT_TIMEOUT_S", "checkpoint_script", "parse_checkpoints"]

CHECKPOINT_TIMEOUT_S: Final = 30.0
"""Longest run of one checkpoint script, in seconds: it reads no file, only tests
names and lists one directory's first entries, so only an unreachable or overloaded
target takes this long."""

_CHECK: Final = r"""
rw_ck() {
  # $1 index, $2 run directory, then the checkpoint's path components.
  rw_i=$1; rw_d=$2; shift 2
  if [ ! -d "$rw_d" ]; then printf '%s C %s rundir 0\n' "$rw_t" "$rw_i"; return 0; fi
  rw_p=$rw_d; rw_n=0
  for rw_c in "$@"; do
    rw_p=$rw_p/$rw_c; rw_n=$((rw_n + 1))
    if [ -h "$rw_p" ]; then printf '%s C %s link %s\n' "$rw_t" "$rw_i" "$rw_n"; return 0; fi
    if [ ! -e "$rw_p" ]; then printf '%s C %s missing %s\n' "$rw_t" "$rw_i" "$rw_n"; return 0; fi
    if [ ! -d "$rw_p" ]; then printf '%s C %s notdir %s\n' "$rw_t" "$rw_i" "$rw_n"; return 0; fi
  done
  # Inside: the physical path under the run directory's own (a component swapped for
  # a link between the tests above and here is caught; builtins only, in subshells).
  rw_top=$(cd -P -- "$rw_d" 2>/dev/null && pwd -P) || rw_top=
  rw_in=$(cd -P -- "$rw_p" 2>/dev/null && pwd -P) || rw_in=
  case $rw_in in
  "$rw_top"/?*) ;;
  *) printf '%s C %s outside 0\n' "$rw_t" "$rw_i"; return 0 ;;
  esac
  if [ ! -r "$rw_p" ] || [ ! -x "$rw_p" ]; then
    printf '%s C %s unreadable 0\n' "$rw_t" "$rw_i"; return 0
  fi
  set -- "$rw_p"/* "$rw_p"/.[!.]* "$rw_p"/..?*
  for rw_e in "$@"; do
    if [ -e "$rw_e" ] || [ -h "$rw_e" ]; then printf '%s C %s ok 0\n' "$rw_t" "$rw_i"; return 0; fi
  done
  printf '%s C %s empty 0\n' "$rw_t" "$rw_i"
}
"""


def _components(checkpoint: str) -> list[str]:
    parts = checkpoint.split("/")
    if not checkpoint or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise InvalidArgument(f"not a relative checkpoint path: {checkpoint[:80]!r}")
    return parts


def checkpoint_script(checks: Sequence[tuple[str, str]], token: str) -> str:
    """One script judging each `(run_dir, checkpoint)` of `checks` (the run directory
    absolute, the checkpoint relative to it, as a proof names it): it prints, each
    record introduced by `token` (random: no name on the target can forge one),
    `C <i> <verdict> <n>`, where the verdict is `ok`, `link`, `missing` or `notdir`
    (of path component `n`, from 1), `outside` (its physical path is not under the
    run directory's), `unreadable`, `empty` or `rundir` (no run directory); then
    `E`. It reads no file and follows no link of the checkpoint's path: every
    component is tested with `[ -h ]` before it is used.

    Raises:
        InvalidArgument: a token that is not alphanumeric, or a checkpoint that is
            not a relative path of plain names.
    """
    if not token.isalnum():
        raise InvalidArgument("the checkpoint token is alphanumeric")
    rows = []
    for index, (run_dir, checkpoint) in enumerate(checks):
        words = " ".join(quote(p) for p in _components(checkpoint))
        rows.append(f"rw_ck {index} {quote(run_dir)} {words}")
    body = "\n".join(rows)
    return f"rw_t={token}\n{_CHECK}\n{body}\nprintf '%s E\\n' \"$rw_t\"\n"


def _why(verdict: str, n: int, checkpoint: str) -> str:
    parts = checkpoint.split("/")
    which = checkpoint if n in (0, len(parts)) else f"{checkpoint}: {'/'.join(parts[:n])}"
    text = {
        "link": f"checkpoint {which} is a symbolic link",
        "missing": f"checkpoint {which} is missing",
        "notdir": f"checkpoint {which} is not a directory",
        "outside": f"checkpoint {checkpoint} resolves outside the run directory",
        "unreadable": f"checkpoint {checkpoint} cannot be read",
        "empty": f"checkpoint {checkpoint} is empty",
        "rundir": "the run directory is missing",
    }.get(verdict)
    if text is None:
        raise ProtocolError(f"checkpoint verdict {verdict[:40]!r}")
    return text


def parse_checkpoints(
    output: bytes, token: str, checkpoints: Sequence[str]
) -> list[str | None]:
    """The verdicts of a [`checkpoint_script`] run over `checkpoints` (the relative
    paths it judged, in order): None for a checkpoint that passes, else why not, for
    a person (`checkpoint output/checkpoint-21 is a symbolic link`).

    Raises:
        ProtocolError: when the answer is cut short or malformed.
    """
    found: dict[int, str | None] = {}
    ended = False
    for line in output.decode("utf-8", "replace").splitlines():
        words = line.split(" ")
        if not line.strip():
            continue
        if words[0] != token:
            raise ProtocolError(f"checkpoint answer {line[:80]!r}")
        try:
            if words[1] == "E":
                ended = True
                continue
            if words[1] != "C" or len(words) != 5:
                raise ValueError("not a record")
            index, verdict, n = int(words[2]), words[3], int(words[4])
            if not 0 <= index < len(checkpoints):
                raise ValueError("no such check")
        except (IndexError, ValueError) as error:
            raise ProtocolError(f"checkpoint answer {line[:80]!r}") from error
        found[index] = None if verdict == "ok" else _why(verdict, n, checkpoints[index])
    if not ended or len(found) != len(checkpoints):
        raise ProtocolError("the checkpoint answer was cut short")
    return [found[index] for index in range(len(checkpoints))]
