"""Status and cancel: the scripts that read what a job is doing and stop it, in the
order of the on-target protocol (docs/protocol.md), and the parser of their answers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from schemas import JobId, JobStatus
from schemas.protocol import CANCEL_FILE, CANCELLING_FILE, EXIT_FILE

from ..errors import ProtocolError
from .common import GROUP_SIGNAL, TICKS_PER_S, check_job_pid, quote

__all__ = [
    "CANCEL_KILL_WAIT_S",
    "CANCEL_TERM_WAIT_S",
    "cancel_script",
    "parse_status",
    "parse_statuses",
    "status_function",
    "status_script",
]

CANCEL_TERM_WAIT_S: Final = 10
"""How long cancel waits for the group to end after SIGTERM, in seconds."""
CANCEL_KILL_WAIT_S: Final = 10
"""How long cancel waits for the group to be gone after SIGKILL, in seconds."""


def status_function() -> str:
    """The shell function `rw_status DIR PGID` printing one status line (see
    [`status_script`])."""
    # The group's liveness is sampled once, before any marker is read: a job that
    # writes its exit code and ends between two reads is then seen as exited, never
    # lost.
    return f"""
rw_status() {{
  if [ ! -d "$1" ]; then echo lost; return 0; fi
  if rw_alive "$2"; then rw_a=1; else rw_a=0; fi
  if [ -e "$1/{CANCEL_FILE}" ]; then echo cancelled
  elif [ -e "$1/{CANCELLING_FILE}" ] && [ "$rw_a" = 1 ]; then echo running
  elif [ -e "$1/{EXIT_FILE}" ]; then
    rw_c=; IFS= read -r rw_c < "$1/{EXIT_FILE}" || :
    printf 'exited %.32s\\n' "$rw_c"
  elif [ -e "$1/{CANCELLING_FILE}" ]; then echo cancelled
  elif [ "$rw_a" = 1 ]; then echo running
  else echo lost
  fi
}}
"""


def status_script(jobs: Sequence[JobId]) -> str:
    """A script printing one status line per job of `jobs`, in order: `running`,
    `exited <code>`, `cancelled` or `lost`, decided in the protocol's order (docs/protocol.md):

    1. `cancelled` exists -> cancelled;
    2. `cancelling` exists and the group is alive -> running;
    3. `exit_code` exists -> exited(code);
    4. `cancelling` exists (group gone) -> cancelled;
    5. the group is alive -> running; otherwise lost. A missing directory is lost.
    """
    calls = "\n".join(f"rw_status {quote(job.dir)} {check_job_pid(job)}" for job in jobs)
    return GROUP_SIGNAL + status_function() + calls + "\n"


_EXITED = re.compile(r"exited (-?[0-9]{1,11})")


def parse_status(line: str) -> JobStatus:
    """The [`JobStatus`] one line of [`status_script`] names.

    Raises:
        ProtocolError: for anything else, such as an `exit_code` file that does not
            hold an integer (the line is shown, cut to 80 characters).
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
        if -(2**31) <= code < 2**31:
            return JobStatus.exited(code)
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


def cancel_script(job: JobId) -> str:
    """A script that cancels `job` as the protocol says, to its end:

    - no-op (exit 0) when `cancelled` or `exit_code` already exists: a recycled pid
      is never signalled, an exited job is never marked cancelled;
    - exit 3 when the run directory does not exist;
    - otherwise writes `cancelling`, stops the container if any
      (`<engine> stop -t 30 <name>`), SIGTERMs the group, waits up to 10 s, SIGKILLs
      it, waits up to 10 s for it to be gone, then writes `cancelled`;
    - exit 5 with a message when the group survives: `cancelling` stays, and a later
      cancel retries.
    """
    container = ""
    if job.container is not None:
        container = (
            f"{quote(job.container.engine)} stop -t 30 {quote(job.container.name)}"
            " >/dev/null 2>&1 || :\n"
        )
    term_ticks = CANCEL_TERM_WAIT_S * TICKS_PER_S
    kill_ticks = CANCEL_KILL_WAIT_S * TICKS_PER_S
    return (
        GROUP_SIGNAL
        + f"""
rw_dir={quote(job.dir)}
rw_pid={check_job_pid(job)}
rw_gone() {{
  rw_i=0
  while rw_alive "$rw_pid"; do
    rw_i=$((rw_i + 1))
    [ "$rw_i" -gt "$1" ] && return 1
    rw_nap
  done
  return 0
}}
if [ -e "$rw_dir/{CANCEL_FILE}" ] || [ -e "$rw_dir/{EXIT_FILE}" ]; then exit 0; fi
if [ ! -d "$rw_dir" ]; then printf '%s does not exist\\n' "$rw_dir" >&2; exit 3; fi
: > "$rw_dir/{CANCELLING_FILE}" || exit 4
{container}rw_signal "$rw_pid" TERM
if ! rw_gone {term_ticks}; then
  rw_signal "$rw_pid" KILL
  if ! rw_gone {kill_ticks}; then
    printf 'process group %s survived SIGKILL\\n' "$rw_pid" >&2
    exit 5
  fi
fi
: > "$rw_dir/{CANCEL_FILE}" || exit 4
"""
    )
