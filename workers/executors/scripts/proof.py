"""The one rule for a proof's checkpoint, on the target: it must resolve, with no
symbolic link on any component of its path, to a non-empty directory inside the run
directory. One script judges a batch of checkpoints (every proof judged in a follow
tick, or the one a deadline or a run's end reads: `sh/checkpoint.sh`, the checks its
arguments), and the parser of its answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ..errors import InvalidArgument, ProtocolError
from .common import Script, sh

__all__ = ["CHECKPOINT_TIMEOUT_S", "checkpoint_script", "parse_checkpoints"]

CHECKPOINT_TIMEOUT_S: Final = 30.0
"""Longest run of one checkpoint script, in seconds: it reads no file, only tests
names and lists one directory's first entries, so only an unreachable or overloaded
target takes this long."""

def _components(checkpoint: str) -> list[str]:
    parts = checkpoint.split("/")
    if not checkpoint or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise InvalidArgument(f"not a relative checkpoint path: {checkpoint[:80]!r}")
    return parts


def checkpoint_script(checks: Sequence[tuple[str, str]], token: str) -> Script:
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
    args = [token]
    for index, (run_dir, checkpoint) in enumerate(checks):
        _components(checkpoint)
        args += [str(index), run_dir, checkpoint]
    return Script(sh("checkpoint"), tuple(args))


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
