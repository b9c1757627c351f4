"""The parts every script shares: the loader of the `.sh` files (`workers/executors/sh/`,
package data), quoting, process-group signalling, and the checks of values a script
takes as numbers (pids)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Final

from schemas import JobId, check_pid

from ..errors import InvalidArgument

__all__ = [
    "CLOCK",
    "GROUP_SIGNAL",
    "READ_FILE",
    "TICKS_PER_S",
    "Script",
    "check_job_pid",
    "job_start",
    "quote",
    "sh",
    "start_arg",
]


@functools.cache
def sh(*names: str) -> str:
    """The text of the files `names` of `workers/executors/sh/` (`status` for
    `status.sh`), concatenated in order: the shared functions first, then the script
    using them. The text of each file is constant: a value reaches a script only as
    an argument ([`Script.args`]) or on its standard input.

    Raises:
        OSError: when a file is missing (an install without its package data).
    """
    root = resources.files("workers.executors").joinpath("sh")
    return "".join(root.joinpath(f"{name}.sh").read_text("utf-8") for name in names)


@dataclass(frozen=True)
class Script:
    """A script to run: its constant `text` (from [`sh`]) and the values it takes as
    positional parameters (`sh -c TEXT rw ARG...`).

    Raises:
        InvalidArgument: when an argument holds a NUL byte (no shell word can).
    """

    text: str
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if any("\0" in arg for arg in self.args):
            raise InvalidArgument("a shell argument cannot hold a NUL byte")

TICKS_PER_S: Final = 10  # the wait loops sleep 0.1 s a turn

GROUP_SIGNAL: Final = sh("group")
"""Shell functions on process groups (`rw_signal`, `rw_alive`, `rw_nap`, `rw_start`,
`rw_ours`): `sh/group.sh`."""
CLOCK: Final = sh("clock")
"""Shell functions on the target's clock (`rw_now`, `rw_sleep`): `sh/clock.sh`."""
READ_FILE: Final = sh("read")
"""`rw_read FILE MAX [OFFSET]`, the bounded read of a job's file: `sh/read.sh`."""


def quote(value: str) -> str:
    """`value` as one POSIX shell word that expands to exactly `value`: single-quoted,
    each `'` written as `'\\''`. Works for every character but NUL.

    Raises:
        InvalidArgument: when `value` holds a NUL byte, which no shell word can.
    """
    if "\0" in value:
        raise InvalidArgument("a shell argument cannot hold a NUL byte")
    return "'" + value.replace("'", "'\\''") + "'"


def check_job_pid(job: JobId) -> int:
    """The pid of `job` as a script may signal it (never 0 or 1).

    Raises:
        InvalidArgument: for any other pid.
    """
    # A JobId built without validation must still never make a script signal the
    # wildcard group 0 or init.
    try:
        return check_pid(job.pid)
    except ValueError as error:
        raise InvalidArgument(str(error)) from error


def start_arg(job: JobId) -> str:
    """The recorded start time of `job`'s leader as a script's argument (`""` when
    unknown): the second argument of `rw_ours`.

    Raises:
        InvalidArgument: for a start time that is not a non-negative integer.
    """
    if job.start is None:
        return ""
    if isinstance(job.start, bool) or not isinstance(job.start, int) or job.start < 0:
        raise InvalidArgument(f"invalid start time {job.start!r}")
    return str(job.start)


def job_start(job: JobId) -> str:
    """The recorded start time of `job`'s leader as a shell word (`''` when unknown)."""
    return start_arg(job) or "''"
