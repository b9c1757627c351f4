"""The parts every script shares: quoting, process-group signalling, and the checks
of values that become numbers in a script (pids)."""

from __future__ import annotations

from typing import Final

from schemas import JobId, check_pid

from ..errors import InvalidArgument

__all__ = [
    "CLOCK",
    "GROUP_SIGNAL",
    "READ_FILE",
    "TICKS_PER_S",
    "check_job_pid",
    "job_start",
    "quote",
]

TICKS_PER_S: Final = 10  # the wait loops sleep 0.1 s a turn

GROUP_SIGNAL: Final = r"""
rw_signal() { kill -s "$2" -- "-$1" 2>/dev/null || kill -s "$2" "-$1" 2>/dev/null; }
rw_alive() { rw_signal "$1" 0; }
rw_nap() { sleep 0.1 2>/dev/null || sleep 1; }
rw_start() {
  rw_st=; rw_l=
  { IFS= read -r rw_l < "/proc/$1/stat"; } 2>/dev/null || return 0
  rw_l=${rw_l##*) }
  set -f; set -- $rw_l; set +f
  if [ "$#" -ge 20 ]; then shift 19; rw_st=$1; fi
  case $rw_st in *[!0-9]*) rw_st= ;; esac
}
rw_ours() {
  rw_alive "$1" || return 1
  [ -n "$2" ] || return 0
  rw_start "$1"
  [ -z "$rw_st" ] || [ "$rw_st" = "$2" ]
}
"""
"""Shell functions on process groups:

- `rw_signal PGID SIG` signals a whole process group under dash (`kill -s SIG --
  -PID`) and busybox (`kill -s SIG -PID`); `rw_alive PGID` tells whether any process
  of the group exists (a zombie counts: whoever started the job reaps it).
- `rw_start PID` sets `rw_st` to the start time of process PID (field 22 of
  `/proc/PID/stat`, clock ticks since boot), empty when unknown (no such process, no
  `/proc`). Read with builtins only: no process is started.
- `rw_ours PGID START` tells whether the group PGID is alive and is the job's: when
  START is known and a process PGID exists, it must have started at START. A pid is
  never reused while a process group of that id exists, so a leader that started at
  another time means the job's group is gone and the pid went to another process."""

CLOCK: Final = r"""
rw_ms=0
rw_now() {
  # rw_ms: the clock in ms; when `date` fails, the last reading plus the $1 ms slept.
  rw_x=$(date +%s%N 2>/dev/null) || rw_x=
  case $rw_x in
  ''|*[!0-9]*)
    rw_x=$(date +%s 2>/dev/null) || rw_x=
    case $rw_x in
    ''|*[!0-9]*) rw_ms=$((rw_ms + $1)) ;;
    *) rw_ms=$((rw_x * 1000)) ;;
    esac ;;
  *) rw_ms=${rw_x%??????} ;;
  esac
}
rw_sleep() {
  rw_f=$((1000 + $1 % 1000))
  sleep "$(($1 / 1000)).${rw_f#1}" 2>/dev/null || sleep $((($1 + 999) / 1000))
}
"""
"""Shell functions on the target's clock, for the watchers that outlive a worker (the
`--max-hours` watchdog, the preemption-notice watcher):

- `rw_now MS` sets `rw_ms` to the clock in milliseconds: `date +%s%N` where that gives
  nanoseconds (GNU), else `date +%s` (whole seconds); when `date` fails, the last
  reading plus MS (the time the caller slept since) stands in for it.
- `rw_sleep MS` sleeps MS milliseconds where `sleep` takes fractions, else the whole
  seconds rounded up."""

READ_FILE: Final = r"""
rw_read() {
  [ -f "$1" ] && [ ! -h "$1" ] || return 3
  if [ -z "$rw_how" ]; then
    if dd if=/dev/null bs=1 count=0 iflag=nonblock,nofollow,skip_bytes,count_bytes \
        status=none 2>/dev/null; then rw_how=dd
    elif command -v timeout >/dev/null 2>&1; then rw_how=timeout
    else rw_how=plain
    fi
  fi
  case $rw_how in
  dd) dd if="$1" bs=65536 skip="${3:-0}" count="$2" \
        iflag=nonblock,nofollow,skip_bytes,count_bytes status=none 2>/dev/null ;;
  timeout) timeout 5 tail -c +$((${3:-0} + 1)) -- "$1" 2>/dev/null | head -c "$2" ;;
  *) tail -c +$((${3:-0} + 1)) -- "$1" 2>/dev/null | head -c "$2" ;;
  esac
}
"""
"""`rw_read FILE MAX [OFFSET]`: at most MAX bytes of FILE from byte OFFSET (default 0),
only when FILE is a regular file and not a symbolic link (else exit status 3, nothing
read). A job may replace any file of its run directory between the test and the
read: GNU `dd` opens it with `O_NONBLOCK | O_NOFOLLOW`, so a FIFO or a link put there
meanwhile never blocks and is never followed; without GNU `dd`, `timeout` bounds the
read to 5 s; without either, the test alone guards it. How is decided once per
script, on the first read (`rw_how`)."""

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


def job_start(job: JobId) -> str:
    """The recorded start time of `job`'s leader as a shell word (`''` when unknown):
    the second argument of `rw_ours`."""
    if job.start is None:
        return "''"
    if isinstance(job.start, bool) or not isinstance(job.start, int) or job.start < 0:
        raise InvalidArgument(f"invalid start time {job.start!r}")
    return str(job.start)
