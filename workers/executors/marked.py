"""Finding a job by its mark, not by its files: the process-group leader of the job
whose processes carry `RUNWARDEN_RUN_ID=<mark>`, with its start time, as the spawn
would have answered (docs/protocol.md, "Spawn"). For a launch whose spawn answer was
lost: `job.pid` is the job's to rewrite, the environment of its wrapper is not. The
script is `sh/marked.sh`, the mark its argument; `Executor.find_marked` runs it."""

from __future__ import annotations

import re
from typing import Final

from schemas.protocol import MARK_FORM, mark_entry

from .base import Executor
from .errors import InvalidArgument, ProtocolError
from .scripts.common import Script, sh

__all__ = ["find_marked_job", "marked_job_script", "parse_marked_job"]

_ANSWER: Final = re.compile(r"([0-9]{1,10}) ([0-9]{1,20})")


def marked_job_script(mark: str) -> Script:
    """A read-only script printing `<pid> <start>` of the oldest process-group leader
    (its pid is its group's) whose environment holds the exact entry
    `RUNWARDEN_RUN_ID=<mark>`, its start time in clock ticks since boot (field 22 of
    `/proc/<pid>/stat`); nothing when there is none (no such process, or no `/proc`).

    The oldest: the job's wrapper starts before any process of the job, so a process
    the job started in a group of its own (`setsid`) is never taken for it.

    Raises:
        InvalidArgument: for a mark that is not a run id.
    """
    if MARK_FORM.fullmatch(mark) is None:
        raise InvalidArgument(f"invalid mark {mark[:80]!r}")
    return Script(sh("group", "sweep", "marked"), (mark_entry(mark),))


def parse_marked_job(output: bytes) -> tuple[int, int] | None:
    """`(pid, start)` from a [`marked_job_script`] answer; None for none.

    Raises:
        ProtocolError: for anything else.
    """
    text = output.decode("ascii", "replace").strip()
    if not text:
        return None
    match = _ANSWER.fullmatch(text)
    if match is None or int(match[1]) <= 1:
        raise ProtocolError(f"marked job {text[:80]!r}")
    return int(match[1]), int(match[2])


def find_marked_job(executor: Executor, mark: str) -> tuple[int, int] | None:
    """`(pid, start)` of the live job marked `mark` on `executor`'s target (see
    [`marked_job_script`]), or None when none lives there.

    Raises:
        ExecError: the target cannot be reached, or answered garbage.
    """
    return executor.find_marked(mark)
