"""Status and cancel: the scripts that read what a job is doing and stop it, in the
order of the on-target protocol (docs/protocol.md), and the parser of their answers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from schemas import JobId, JobStatus
from schemas.protocol import CANCEL_FILE, CANCELLING_FILE, EXIT_FILE, RUN_ID_ENV

from ..errors import ProtocolError
from .common import GROUP_SIGNAL, READ_FILE, TICKS_PER_S, check_job_pid, job_start, quote

__all__ = [
    "CANCEL_KILL_WAIT_S",
    "CANCEL_TERM_WAIT_S",
    "MARK_SWEEP",
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
    """The shell function `rw_status DIR PGID START` printing one status line (see
    [`status_script`]). Needs `GROUP_SIGNAL` and `READ_FILE`."""
    # The group's liveness is sampled once, before any marker is read: a job that
    # writes its exit code and ends between two reads is then seen as exited, never
    # lost. With the leader's start time known, a live group is running whatever the
    # files say: every file of the run directory is the job's to write, and a job
    # must not be able to forge its end.
    return f"""
rw_status() {{
  rw_a=0
  if [ -n "$3" ]; then
    if rw_ours "$2" "$3"; then echo running; return 0; fi
  elif rw_alive "$2"; then rw_a=1
  fi
  if [ ! -d "$1" ]; then echo lost
  elif [ -e "$1/{CANCEL_FILE}" ] || [ -h "$1/{CANCEL_FILE}" ]; then echo cancelled
  elif [ "$rw_a" = 1 ] && {{ [ -e "$1/{CANCELLING_FILE}" ] || [ -h "$1/{CANCELLING_FILE}" ]; }}
  then echo running
  else
    rw_c=
    if [ -f "$1/{EXIT_FILE}" ] && [ ! -h "$1/{EXIT_FILE}" ]; then
      rw_c=$(rw_read "$1/{EXIT_FILE}" 32) || rw_c=
    fi
    case $rw_c in
    ''|-|*[!0-9-]*|?*-*) rw_c= ;;
    *) [ "${{#rw_c}}" -le 11 ] || rw_c= ;;
    esac
    if [ -n "$rw_c" ]; then printf 'exited %s\\n' "$rw_c"
    elif [ -e "$1/{CANCELLING_FILE}" ] || [ -h "$1/{CANCELLING_FILE}" ]; then echo cancelled
    elif [ "$rw_a" = 1 ]; then echo running
    else echo lost
    fi
  fi
}}
"""


def status_script(jobs: Sequence[JobId]) -> str:
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
    calls = "\n".join(
        f"rw_status {quote(job.dir)} {check_job_pid(job)} {job_start(job)}" for job in jobs
    )
    return GROUP_SIGNAL + READ_FILE + status_function() + calls + "\n"


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


MARK_SWEEP: Final = r"""
rw_marked() {
  rw_found=$(grep -lsxzF -- "$1" /proc/[0-9]*/environ 2>/dev/null)
  rw_left=
  for rw_f in $rw_found; do
    rw_p=${rw_f#/proc/}; rw_p=${rw_p%/environ}
    case $rw_p in ''|*[!0-9]*) continue ;; esac
    [ "$rw_p" = "$$" ] || [ "$rw_p" -le 1 ] || rw_left="$rw_left $rw_p"
  done
}
rw_sweep() {
  rw_i=0
  while rw_marked "$1"; [ -n "$rw_left" ]; do
    if [ "$rw_i" = 0 ]; then kill -s TERM $rw_left 2>/dev/null || :; fi
    if [ "$rw_i" = "$2" ]; then kill -s KILL $rw_left 2>/dev/null || :; fi
    rw_i=$((rw_i + 1))
    [ "$rw_i" -gt "$3" ] && return 1
    rw_nap
  done
  return 0
}
"""
"""Shell functions over the processes that carry a run's mark, an exact entry
`RUNWARDEN_RUN_ID=<id>` of their environment (`/proc/<pid>/environ`, readable for
the target user's own processes): `rw_marked ENTRY` sets `rw_left` to their pids
(never this script, pid 0 or 1); `rw_sweep ENTRY KILL_AT GIVE_UP` sends them TERM,
KILL after KILL_AT turns of 0.1 s, and returns 1 when some are still there after
GIVE_UP turns. A zombie's environment reads empty: it counts as gone."""


def cancel_script(job: JobId) -> str:
    """A script that cancels `job` to its end:

    - while the job's process group is alive and is the job's (`rw_ours`: never a
      reused pid; pid 0 and 1 are never signalled), whatever its files say (a job
      may write `exit_code` or `cancelled` itself) when the leader's start time is
      known; without it (an adopted job), as overbrainer does, never when `exit_code`
      or `cancelled` exists (the pid may have gone to another process): writes
      `cancelling` (when it can), stops the container if any (`<engine> stop -t 30
      <name>`), SIGTERMs the group, waits up to 10 s, SIGKILLs it, waits up to 10 s
      for it to be gone (both waits by the clock where `/proc/uptime` tells it, so a
      loaded machine's slow naps never stretch them); exit 5 with a message when it
      survives (`cancelling` stays, and a later cancel retries);
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
    container = ""
    if job.container is not None:
        container = (
            f"{quote(job.container.engine)} stop -t 30 {quote(job.container.name)}"
            " >/dev/null 2>&1 || :\n"
        )
    term_ticks = CANCEL_TERM_WAIT_S * TICKS_PER_S
    kill_ticks = CANCEL_KILL_WAIT_S * TICKS_PER_S
    sweep = ""
    if job.mark is not None:
        entry = quote(f"{RUN_ID_ENV}={job.mark}")
        sweep = f"""if ! rw_sweep {entry} {term_ticks} {term_ticks + kill_ticks}; then
  printf 'processes of run %s survived SIGKILL:%s\\n' {quote(job.mark)} "$rw_left" >&2
  exit 5
fi
"""
    return (
        GROUP_SIGNAL
        + MARK_SWEEP
        + f"""
rw_dir={quote(job.dir)}
rw_pid={check_job_pid(job)}
rw_begun={job_start(job)}
rw_up() {{
  # Seconds since boot, read with a builtin (empty without /proc): a loaded machine
  # stretches the naps, never the waits measured by it.
  rw_s=; {{ read -r rw_s _ < /proc/uptime; }} 2>/dev/null || :
  rw_s=${{rw_s%%.*}}; case $rw_s in *[!0-9]*) rw_s= ;; esac
}}
rw_gone() {{
  # $1 turns of 0.1 s at most, and $1 / {TICKS_PER_S} s by the clock when it is known.
  rw_i=0; rw_up; rw_t0=$rw_s
  while rw_ours "$rw_pid" "$rw_begun"; do
    rw_i=$((rw_i + 1))
    [ "$rw_i" -gt "$1" ] && return 1
    if [ -n "$rw_t0" ]; then
      rw_up; [ -n "$rw_s" ] && [ $((rw_s - rw_t0)) -ge $(($1 / {TICKS_PER_S})) ] && return 1
    fi
    rw_nap
  done
  return 0
}}
rw_mark() {{
  if [ -d "$rw_dir" ] && [ ! -e "$rw_dir/$1" ] && [ ! -h "$rw_dir/$1" ]; then
    # `true`, not `:`: a failed redirection of a special builtin ends the script.
    {{ true > "$rw_dir/$1"; }} 2>/dev/null || :
  fi
}}
rw_signalled=
rw_ended=
if [ -z "$rw_begun" ] && [ -d "$rw_dir" ] &&
  {{ [ -e "$rw_dir/{EXIT_FILE}" ] || [ -e "$rw_dir/{CANCEL_FILE}" ]; }}; then
  rw_ended=1
fi
if [ -z "$rw_ended" ] && rw_ours "$rw_pid" "$rw_begun"; then
  rw_signalled=1
  rw_mark {CANCELLING_FILE}
  {container}rw_signal "$rw_pid" TERM
  if ! rw_gone {term_ticks}; then
    rw_signal "$rw_pid" KILL
    if ! rw_gone {kill_ticks}; then
      printf 'process group %s survived SIGKILL\\n' "$rw_pid" >&2
      exit 5
    fi
  fi
elif [ -d "$rw_dir" ] && [ ! -e "$rw_dir/{EXIT_FILE}" ] && [ ! -e "$rw_dir/{CANCEL_FILE}" ]; then
  rw_signalled=1
  rw_mark {CANCELLING_FILE}
fi
{sweep}if [ -n "$rw_signalled" ]; then rw_mark {CANCEL_FILE}; fi
"""
    )
