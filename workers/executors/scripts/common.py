"""The parts every script shares: quoting, process-group signalling, and the checks
of values that become numbers in a script (pids)."""

from __future__ import annotations

from typing import Final

from schemas import JobId, check_pid

from ..errors import InvalidArgument

__all__ = ["GROUP_SIGNAL", "TICKS_PER_S", "check_job_pid", "quote"]

TICKS_PER_S: Final = 10  # the wait loops sleep 0.1 s a turn

GROUP_SIGNAL: Final = r"""
rw_signal() { kill -s "$2" -- "-$1" 2>/dev/null || kill -s "$2" "-$1" 2>/dev/null; }
rw_alive() { rw_signal "$1" 0; }
rw_nap() { sleep 0.1 2>/dev/null || sleep 1; }
"""
"""Shell functions: `rw_signal PGID SIG` signals a whole process group under dash
(`kill -s SIG -- -PID`) and busybox (`kill -s SIG -PID`); `rw_alive PGID` tells
whether any process of the group exists (a zombie counts: whoever started the job
reaps it)."""


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
