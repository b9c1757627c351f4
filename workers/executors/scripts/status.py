"""Status and cancel: the scripts that read what a job is doing and stop it, in the
order of the on-target protocol (docs/protocol.md), and the parser of their answers.
Their text is `sh/status.sh` and `sh/cancel.sh` (with `status_fn.sh`, `group.sh`,
`read.sh`, `sweep.sh`); the jobs are their arguments."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from schemas import JobId, JobStatus
from schemas.protocol import mark_entry

from ..errors import InvalidArgument, ProtocolError
from .common import TICKS_PER_S, Script, check_job_pid, sh, start_arg

__all__ = [
    "CANCEL_KILL_WAIT_S",
    "CANCEL_TERM_WAIT_S",
    "MARK_SWEEP",
    "cancel_script",
    "leaders_script",
    "parse_leaders",
    "parse_status",
    "parse_statuses",
    "release_script",
    "status_function",
    "status_script",
]

CANCEL_TERM_WAIT_S: Final = 10
"""How long cancel waits for the group to end after SIGTERM, in seconds."""
CANCEL_KILL_WAIT_S: Final = 10
"""How long cancel waits for the group to be gone after SIGKILL, in seconds."""


def status_function() -> str:
    """The shell function `rw_status DIR PGID START` printing one status line (see
    [`status_script`]; `sh/status_fn.sh`). Needs `GROUP_SIGNAL` and `READ_FILE`."""
    return sh("status_fn")


def status_script(jobs: Sequence[JobId]) -> Script:
    """A script printing one status line per job of `jobs`, in order: `running`,
    `exited <code>`, `cancelled` or `lost` (docs/protocol.md, "Status").

    A job whose leader's start time is known (`JobId.start`: every job runwarden
    launched on a target with `/proc`):

    1. its group is alive and is the job's (`rw_ours`: a reused pid is not) ->
       running, whatever the files say: the job cannot forge its end;
    2. the run directory is missing -> lost;
    3. `cancelled` exists -> cancelled;
    4. `exit_code` is a regular file holding one integer of at most 11 characters
       (a line end after it allowed) -> exited(code); an `exit_code` that is anything
       else (a directory, a link, garbage) is no exit code, and the next rule decides;
    5. `cancelling` exists -> cancelled (a cancel killed it: a garbage `exit_code`
       the job left never turns that into lost); otherwise lost.

    Any other job (adopted, or a target without `/proc`), in overbrainer's order, the
    group's liveness sampled once before any marker is read: the directory is
    missing -> lost; `cancelled` -> cancelled; `cancelling` and the group alive ->
    running; `exit_code` (as in 4) -> exited(code); `cancelling` -> cancelled; the
    group alive -> running; otherwise lost. There, `cancelled` and `exit_code` win
    over a live group, so a pid reused by another process is never taken for the
    job.
    """
    args: list[str] = []
    for job in jobs:
        args += [job.dir, str(check_job_pid(job)), start_arg(job)]
    return Script(sh("group", "read", "status_fn", "status"), tuple(args))


_EXITED = re.compile(r"exited (-?[0-9]{1,11})")


def parse_status(line: str) -> JobStatus:
    """The [`JobStatus`] one line of [`status_script`] names.

    An exit code outside 32 bits reads as lost (no exit code).

    Raises:
        ProtocolError: for anything else (the line is shown, cut to 80 characters).
    """
    text = line.strip()
    if text == "running":
        return JobStatus.RUNNING
    if text == "cancelled":
        return JobStatus.CANCELLED
    if text == "lost":
        return JobStatus.LOST
    match = _EXITED.fullmatch(text)
    if match is not None:
        code = int(match[1])
        # An exit status outside 32 bits was not written by the job's wrapper: no
        # exit code, as a garbage one is.
        return JobStatus.exited(code) if -(2**31) <= code < 2**31 else JobStatus.LOST
    raise ProtocolError(f"status {text[:80]!r}")


def parse_statuses(output: bytes, count: int) -> list[JobStatus | ProtocolError]:
    """The statuses of a [`status_script`] run over `count` jobs, in order. A line
    that does not parse (a garbage `exit_code` file in one run directory) gives that
    job a [`ProtocolError`], and the others their status.

    Raises:
        ProtocolError: when the output is not `count` lines.
    """
    lines = output.decode("utf-8", "replace").splitlines()
    if len(lines) != count:
        raise ProtocolError(f"{len(lines)} status lines for {count} jobs")
    results: list[JobStatus | ProtocolError] = []
    for line in lines:
        try:
            results.append(parse_status(line))
        except ProtocolError as error:
            results.append(error)
    return results


def leaders_script(jobs: Sequence[JobId]) -> Script:
    """A script telling, per job of `jobs` (each with its leader's start time,
    `JobId.start`), whether its leader runs and is the job's: for the control user of
    an SSH target whose jobs run as another user, who reads `/proc` but may not signal
    the jobs (`sh/leaders.sh`; parsed by [`parse_leaders`]).

    Raises:
        InvalidArgument: for a job without a start time, or a pid 0 or 1.
    """
    args: list[str] = []
    for job in jobs:
        if job.start is None:
            raise InvalidArgument("a job's leader is told only by its start time")
        args += [str(check_job_pid(job)), start_arg(job)]
    return Script(sh("leaders"), tuple(args))


def parse_leaders(output: bytes, count: int) -> list[bool]:
    """The answers of a [`leaders_script`] over `count` jobs, in order.

    Raises:
        ProtocolError: when the output is not `count` lines of `1` or `0`.
    """
    lines = output.decode("ascii", "replace").splitlines()
    if len(lines) != count or any(line not in ("0", "1") for line in lines):
        raise ProtocolError(f"leaders answered {output[:80]!r} for {count} jobs")
    return [line == "1" for line in lines]


MARK_SWEEP: Final = sh("sweep")
"""Shell functions over the processes that carry a run's mark (`rw_marked`,
`rw_sweep`): `sh/sweep.sh`."""


def cancel_script(job: JobId) -> Script:
    """A script that cancels `job` to its end:

    - while the job's process group is alive and is the job's (`rw_ours`: never a
      reused pid; pid 0 and 1 are never signalled), whatever its files say (a job
      may write `exit_code` or `cancelled` itself) when the leader's start time is
      known; without it (an adopted job), as overbrainer does, never when `exit_code`
      or `cancelled` exists (the pid may have gone to another process): writes
      `cancelling` (when it can), stops the container if any (`<engine> stop -t 30
      <name>`), SIGTERMs the group, waits up to 10 s, SIGKILLs it, waits up to 10 s
      for it to be gone (both waits by the clock where `/proc/uptime` tells it, so a
      loaded machine's slow naps never stretch them; each looks every 0.02 s for its
      first 0.1 s, as a group mostly ends within milliseconds, then every 0.1 s);
      exit 5 with a message when it survives (`cancelling` stays, and a later cancel
      retries);
    - then, when the job has a cgroup (`JobId.cgroup`), every process still in it
      (whatever session or environment it made itself) gets SIGTERM, `cgroup.kill`
      after 10 s, exit 5 when one survives 10 s more; the empty cgroup is removed;
      the group is then looked at again, SIGKILLed when still there after 0.1 s (a
      job of root's may have moved its processes out of the cgroup) and waited for
      up to 10 s more: the cgroup's kill may leave the group's last members zombies
      for a moment, which `kill -0` still finds and status would call running;
    - then, when the job has a mark (`JobId.mark`), every process still carrying it
      (one that left the group: `setsid`, a daemon) gets SIGTERM, SIGKILL after
      10 s, and exit 5 when one survives 10 s more. A process that cleared or
      rewrote its environment is out of reach;
    - finally writes `cancelled` when the group was signalled, or when it was gone
      with neither `exit_code` nor `cancelled` (a lost job); a job that exited by
      itself is left as it is.

    A run directory that is gone is no error: there is nothing to mark. The group
    gets one SIGTERM per cancel from this script (and one more a second later from
    the job wrapper, which sees `cancelling`: `scripts.launch.wrapper_script`).
    """
    engine = name = ""
    if job.container is not None:
        engine, name = job.container.engine, job.container.name
    entry = mark = ""
    if job.mark is not None:
        entry, mark = mark_entry(job.mark), job.mark
    args = (
        job.dir,
        str(check_job_pid(job)),
        start_arg(job),
        str(CANCEL_TERM_WAIT_S * TICKS_PER_S),
        str(CANCEL_KILL_WAIT_S * TICKS_PER_S),
        str(TICKS_PER_S),
        entry,
        mark,
        engine,
        name,
        job.cgroup or "",
    )
    return Script(sh("group", "sweep", "cgroup", "cancel"), args)


def release_script(job: JobId) -> Script:
    """A script that ends what is left of the finished `job` at once (`sh/release.sh`):
    every process in its cgroup (`JobId.cgroup`) and every process still carrying its
    mark (`JobId.mark`), SIGTERM then SIGKILL (`cgroup.kill`) 0.1 s later: its
    wrapper gave every process it could find SIGTERM and 10 s before it wrote
    `exit_code`, or a cancel gave them SIGTERM and its grace, so what is left hid
    from them or outlived a cancel cut short (its worker killed). The emptied cgroup
    is removed; exit 5 when something survives 5 s. A cgroup that is gone is no
    error. A process that left the cgroup-less group and cleared its environment is
    out of its reach, as of the cancel's."""
    entry = "" if job.mark is None else mark_entry(job.mark)
    return Script(sh("group", "cgroup", "sweep", "release"), (job.cgroup or "", entry))
