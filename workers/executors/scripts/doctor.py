"""The doctor's probe: one POSIX `sh` script (`sh/doctor.sh`) that finds what the
other scripts of this package need on a target (the shell, `setsid`, `tar`, the
coreutils pieces, `/proc`, an HTTP client, Python, the workdir, its disk), a tiny
script reading the target's clock (`sh/clock_reading.sh`), and the parsers of their
answers. What each finding means, and what it breaks,
is decided by `workers.executors.doctor`.

The probe changes nothing on the target but one scratch directory of its own, made
and removed by itself: `<workdir>/.runwarden-doctor.<pid>.<random>` where the job's
user must write run directories (in the nearest existing parent of a workdir that
does not exist yet, which the first claim would create there), else one `mktemp -d`
makes (a workdir that is not the job's to write: a worker that is root makes run
directories there itself),
used to try `mv -T` and an extraction, and removed before the script ends (a trap
removes it on `HUP`, `INT` or `TERM`). Only a `SIGKILL` (a script past its deadline)
can leave it behind, under that name. Every other test reads, or writes to
`/dev/null`.
"""

from __future__ import annotations

import re
from typing import Final

from ..errors import InvalidArgument, ProtocolError
from .common import Script, sh

__all__ = [
    "CLOCK_SCRIPT",
    "DOCTOR_OUTPUT_LIMIT",
    "DOCTOR_TIMEOUT_S",
    "DOCTOR_VALUE_LIMIT",
    "SCRATCH_PREFIX",
    "doctor_script",
    "parse_clock",
    "parse_doctor",
]

DOCTOR_TIMEOUT_S: Final = 60.0
"""Longest run of the probe, in seconds (Python's start is the slowest part)."""
DOCTOR_OUTPUT_LIMIT: Final = 64 * 1024
"""Bytes of the probe's output [`parse_doctor`] looks at; the rest is ignored."""
DOCTOR_VALUE_LIMIT: Final = 300
"""Characters kept of one finding."""
SCRATCH_PREFIX: Final = ".runwarden-doctor."
"""The name of the probe's scratch directory starts with this."""

UTILITIES: Final = (
    "cat", "date", "df", "du", "find", "grep", "head", "ln", "mkdir", "mkfifo", "mv",
    "od", "rm", "sed", "sleep", "tail", "tr", "xargs",
)  # fmt: skip
"""The programs the scripts call besides the shell's builtins, `setsid`, `tar`,
`sha256sum`, `dd`, `timeout` and the HTTP clients, which have checks of their own.
`od` encodes the follow's bytes where there is no `base64` (which needs no check:
without it the follow uses `od`)."""

_KEY: Final = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHA256_OF_ABC: Final = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

_SCRATCH_RANDOM: Final = re.compile(r"[0-9a-f]{12}")


def doctor_script(
    workdir: str, token: str, *, job_writes_workdir: bool, random: str
) -> Script:
    """The probe of a target whose run directories live under `workdir`. It prints
    one finding a line, `<token> <key> <value>` (`value` one line, at most 200 bytes,
    empty when there is nothing), and `<token> end .` last; see the module docstring
    for what it writes. `job_writes_workdir` says whether the job's user makes run
    directories in `workdir` (then the probe tries to, as that user); `random` (12 hex
    digits) names its scratch directory.

    Keys (`yes`/`no` unless said): `sh_exe` (the shell's program, from `/proc`),
    `sh_version` (`$BASH_VERSION` and the like), `sh_posix` (parameter expansions,
    arithmetic, functions, `set -C`, `trap`); `setsid` (its path); `tar` (path),
    `tar_version` (first line of `--version`, else of `--help`), `tar_create` (a list
    archived as retrieval does: `--null --no-recursion --hard-dereference -T -`),
    `tar_extract` (an empty archive unpacked as upload does: `-x -o -C`);
    `sha256sum` (path), `sha256sum_works` (the hash of `abc`), `sha256sum_z`;
    `dd_nonblock` (the read of `scripts.common.READ_FILE`); `timeout` (path),
    `timeout_works`; `sleep_fraction`; `utilities_missing` and `utilities_broken`
    (space-separated: programs of [`UTILITIES`] absent; `head-c`, `find-print0`,
    `xargs-0`, `grep-z` that do not work); `proc_stat`, `proc_environ` (a child
    finds its own mark in `/proc/<pid>/environ` with `grep -z`, as cancel's sweep
    does); `curl`, `wget` (paths), `wget_version`; `python` (path of `python3`),
    `python_version` (`X.Y.Z`); `workdir` (exists), else `workdir_parent` (the
    nearest directory that exists); `writable` (only when the job writes the
    workdir: a directory was made in the workdir, else in that parent, as the
    claim's `mkdir -p` would); `df` (the data line of `df -Pk` of the workdir, else
    of that parent); `scratch` (a scratch directory was made), `mv_t` (`mv -fT`
    over a file).

    Raises:
        InvalidArgument: for a token that is not alphanumeric, a workdir that is not
            absolute, or `random` that is not 12 hex digits.
    """
    if not token.isalnum() or not token.isascii():
        raise InvalidArgument("the probe token is alphanumeric")
    if not workdir.startswith("/"):
        raise InvalidArgument(f"not an absolute path: {workdir[:200]!r}")
    if _SCRATCH_RANDOM.fullmatch(random) is None:
        raise InvalidArgument("the scratch name's random part is 12 hex digits")
    args = (
        token,
        workdir,
        "1" if job_writes_workdir else "0",
        _SHA256_OF_ABC,
        SCRATCH_PREFIX,
        random,
        *UTILITIES,
    )
    return Script(sh("doctor"), args)


def parse_doctor(output: bytes, token: str) -> dict[str, str]:
    """The findings of a [`doctor_script`] run: key -> value. Reads at most
    [`DOCTOR_OUTPUT_LIMIT`] bytes, lines ending in `\n` or `\r\n`; a line that does
    not start with the token, or whose key is not a lower-case name, is ignored; a
    value is decoded (bad UTF-8 replaced), stripped of control characters and cut to
    [`DOCTOR_VALUE_LIMIT`] characters; of a key given twice, the first value counts.

    Raises:
        ProtocolError: when the end record is not within the bytes read (the probe
            was cut short, or the shell could not run it).
    """
    head = token.encode() + b" "
    found: dict[str, str] = {}
    for line in output[:DOCTOR_OUTPUT_LIMIT].split(b"\n"):
        line = line.removesuffix(b"\r")  # noqa: PLW2901 - a line end of `\r\n` is one end
        if not line.startswith(head):
            continue
        key_bytes, _, raw = line[len(head) :].partition(b" ")
        key = key_bytes.decode("ascii", "replace")
        if _KEY.fullmatch(key) is None:
            continue
        if key == "end":
            return found
        text = raw.decode("utf-8", "replace")
        value = "".join(c for c in text if c.isprintable())[:DOCTOR_VALUE_LIMIT].strip()
        found.setdefault(key, value)
    raise ProtocolError("the doctor's probe was cut short (no end record)")


CLOCK_SCRIPT: Final = Script(sh("clock_reading"))
"""Prints the target's clock: Unix nanoseconds where `date` has `%N` (GNU), else
Unix seconds (busybox, BSD). `sh/clock_reading.sh`."""

_NS_DIGITS: Final = 19  # Unix time in ns has 19 digits from 2001 to 2286


def parse_clock(output: bytes) -> tuple[float, float]:
    """The target's time in Unix seconds and the resolution of that reading in
    seconds (1e-9 for nanoseconds, 1 for whole seconds), from a [`CLOCK_SCRIPT`]
    answer.

    Raises:
        ProtocolError: for anything but one line of 1 to 12 digits (seconds) or of
            19 or 20 digits (nanoseconds).
    """
    text = output[:64].decode("ascii", "replace").strip()
    if text.isdigit() and text.isascii():
        if 1 <= len(text) <= 12:
            return float(text), 1.0
        if _NS_DIGITS <= len(text) <= _NS_DIGITS + 1:
            return int(text) / 1e9, 1e-9
    raise ProtocolError(f"the target's clock answered {text[:40]!r}")
