"""Whether a job on this machine is running, read by the worker itself from the
kernel: the control plane's own view, which no process of the job can forge, pause
or kill.

A status script runs as the job's user on a run-as target, where every process of
that user may stop it, kill it or write into its output (`/proc/<pid>/fd/1`, or
`ptrace` on a kernel without Yama). So a target on this machine asks this module
first, and runs the status script only for the jobs it does not find running
([`ScriptExecutor.statuses`](shell.ScriptExecutor.statuses)): a live job is never
reported ended on a script's word, and a paused script delays only the jobs whose
end it would have read.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["group_exists", "group_is_the_jobs"]

_STAT_BYTES: Final = 4096
"""Bytes of `/proc/<pid>/stat` read: the whole line (a command name is at most 64)."""


def group_exists(pgid: int) -> bool:
    """Whether any process of the group `pgid` exists (a zombie included), whatever
    user it runs as: signal 0, where `EPERM` is an answer too (`rw_alive`)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # the group exists: another user's
    return True


def group_is_the_jobs(pgid: int, start: int) -> bool:
    """Whether the process group `pgid` is alive and is the job's whose leader started
    `start` clock ticks after boot: the rule of the scripts' `rw_ours` (`sh/group.sh`),
    read here. A group exists while any member does, a zombie included (whoever started
    the job reaps it), whatever user it runs as (`EPERM` is an answer too); when the
    leader itself is gone the group is the job's (a pid is never reused while a group
    of that id exists); when it is there it must have started at `start`, or the pid
    went to another process after the job's group ended.

    Takes no more than one signal-0 and one bounded read of `/proc/<pgid>/stat`;
    never raises for a process that ends meanwhile.

    Raises:
        ValueError: for a `pgid` of 1 or less (no job's group; `os.killpg` would
            reach every process for 0 or less).
    """
    if pgid <= 1:
        raise ValueError(f"no job's process group: {pgid}")
    if not group_exists(pgid):
        return False
    try:
        with open(f"/proc/{pgid}/stat", "rb") as file:
            line = file.read(_STAT_BYTES)
    except FileNotFoundError:
        return True
    except OSError:
        return True  # alive, start unreadable: as `rw_ours` without /proc
    # The command name (field 2) may hold anything, `) ` included: the fields after
    # it start after its last `) `.
    fields = line.rpartition(b") ")[2].split()
    if len(fields) < 20:
        return True
    return fields[19] == str(start).encode()
