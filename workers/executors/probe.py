"""The read-only disk probe of a target, for the disk policy: one POSIX `sh` script for
all run directories of a target, and its parser into `schemas.policy.DiskSample`s
(the decision on a sample is `schemas.policy.disk_verdict`).

The script (`sh/disk.sh`, the directories its arguments) changes nothing on the
target: it only runs `df -Pk`, `du -sk`, tests and a glob. `Executor.disk_usage`
runs it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from schemas.policy import DiskSample

from .errors import InvalidArgument, ProtocolError
from .scripts.common import Script, sh

__all__ = ["disk_probe_script", "parse_disk_probe"]

_KIB: Final = 1024
_MAX_STEP_DIGITS: Final = 18  # `[ -gt ]` compares 64-bit integers


def disk_probe_script(run_dirs: Sequence[str], token: str) -> Script:
    """One read-only script probing every directory of `run_dirs`, in order. For the
    `i`-th it prints, each record introduced by `token` (random, so no mount point or
    file name can forge one):

    - `<token> M <i>` when the directory does not exist;
    - else `<token> D <i> <kib>`, `kib` being `du -sk` of the newest checkpoint
      (`output/checkpoint-<N>` with the highest N, compared as a number; only
      canonical decimal steps count, directories only, symbolic links not followed)
      or `-` when there is none, then the output of `df -Pk` for the directory (a
      header and one line: POSIX output never wraps a long device name), and
      `<token> F <i>` after it when df failed (its output is then its error);

    and `<token> E` last.

    Raises:
        InvalidArgument: for a token that is not alphanumeric, or a directory that is
            not an absolute path.
    """
    if not token.isalnum() or not token.isascii():
        raise InvalidArgument("the probe token is alphanumeric")
    for run_dir in run_dirs:
        if not run_dir.startswith("/"):
            raise InvalidArgument(f"not an absolute path: {run_dir[:200]!r}")
    return Script(sh("disk"), (token, str(_MAX_STEP_DIGITS), *run_dirs))


# A `df -P` line: filesystem (any text), then 1024-blocks, used, available, capacity
# (`N%`, or `-` for a filesystem without blocks) and the mount point.
_DF_LINE = re.compile(rb"(?:^|\s)(\d+)\s+(\d+)\s+(\d+)\s+(?:\d+%|-)(?:\s|$)")


def _sample(payload: bytes, checkpoint: str) -> DiskSample:
    lines = payload.split(b"\n", 1)
    data = lines[1] if len(lines) == 2 else b""
    match = _DF_LINE.search(data)
    if match is None:
        raise ProtocolError(f"df answered {payload[:120]!r}")
    size, used, avail = (int(match[n]) * _KIB for n in (1, 2, 3))
    checkpoint_bytes = None if checkpoint == "-" else int(checkpoint) * _KIB
    return DiskSample(size, used, avail, checkpoint_bytes)


def _index(words: list[str], head: bytes, count: int) -> int:
    try:
        index = int(words[1])
    except (IndexError, ValueError) as error:
        raise ProtocolError(f"disk probe record {head[:80]!r}") from error
    if not 0 <= index < count:
        raise ProtocolError(f"disk probe record for directory {index} of {count}")
    return index


def parse_disk_probe(output: bytes, token: str, count: int) -> list[DiskSample | ProtocolError]:
    """The samples of a [`disk_probe_script`] run over `count` directories, in order. A
    directory that could not be probed gets a [`ProtocolError`] saying why (it does
    not exist, df failed, a record is garbled); the others their sample.

    Raises:
        ProtocolError: when the output is cut short (no end record), holds text
            before its first record, or names a directory out of range.
    """
    parts = output.split(token.encode())
    if parts[0].strip():
        raise ProtocolError("disk probe output before its first record")
    failed: dict[int, ProtocolError] = {}
    found: dict[int, tuple[str, bytes]] = {}  # index -> (checkpoint KiB or "-", df output)
    ended = False
    for part in parts[1:]:
        head, _, payload = part.partition(b"\n")
        words = head.decode("utf-8", "replace").split()
        if words == ["E"]:
            ended = True
            continue
        index = _index(words, head, count)
        if words == ["M", words[1]]:
            failed[index] = ProtocolError("the run directory does not exist")
        elif words[0] == "D" and len(words) == 3 and (words[2] == "-" or words[2].isdecimal()):
            found[index] = (words[2], payload)
        elif words == ["F", words[1]] and index in found:
            message = found.pop(index)[1].strip().decode("utf-8", "replace")[:200]
            failed[index] = ProtocolError(f"df failed: {message or 'no output'}")
        else:
            failed[index] = ProtocolError(f"disk probe record {head[:80]!r}")
    if not ended:
        raise ProtocolError("the disk probe output was cut short")
    return [_result(index, failed, found) for index in range(count)]


def _result(
    index: int, failed: dict[int, ProtocolError], found: dict[int, tuple[str, bytes]]
) -> DiskSample | ProtocolError:
    if index in failed:
        return failed[index]
    if index not in found:
        return ProtocolError("no disk probe record")
    checkpoint, payload = found[index]
    try:
        return _sample(payload, checkpoint)
    except ProtocolError as error:
        return error
