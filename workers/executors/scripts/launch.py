"""Starting a job: the launcher that detaches it into its own session, the wrapper that
records its pid and exit code, and the on-target watchdog that asks for its
`deadline` snapshot with every worker gone."""

from __future__ import annotations

import math
import secrets as _secrets
from collections.abc import Mapping, Sequence
from typing import Final

from schemas.protocol import (
    CANCEL_FILE,
    CANCELLING_FILE,
    EXIT_FILE,
    JOB_LOG,
    JOBSIDE_DIR,
    NOTICE_FILE,
    NOTICE_PID_FILE,
    NOTICE_STATE_FILE,
    PID_FILE,
    SNAPSHOT_FILE,
    SNAPSHOT_REQUEST,
)

from ..errors import InvalidArgument
from .common import CLOCK, GROUP_SIGNAL, quote

__all__ = ["WATCHDOG_PID_FILE", "launcher_script", "watchdog_script", "wrapper_script"]

PREEMPTION_SIGNALS: Final = ("TERM", "USR1", "USR2", "XCPU")
"""Signals the job wrapper outlives (a no-op trap; the job itself gets them with their
default action): a signal sent to the whole process group (a systemd stop, Slurm's
`--signal` without `B:`, Kubernetes' SIGTERM to a pod) then reaches the job, which may
save and exit, and the wrapper still records its exit code."""


def wrapper_script(dir: str, script: str) -> str:
    """The job wrapper, run as `sh -c WRAPPER rw-job SH MV` by the session leader of
    the job (`SH` and `MV` the absolute paths of `sh` and `mv`, so the job's own
    `PATH` never changes what the wrapper runs): writes its own pid to `job.pid`
    first, runs `script` in a child `sh`, then writes the script's exit code to
    `exit_code` last (both through a temporary name and a rename).

    It outlives [`PREEMPTION_SIGNALS`] (a signal caught while it waits ends the
    `wait`, not the job, so it waits again while the job runs), except when the
    `cancelling` marker exists: runwarden's cancel then ends it as before, so no exit
    code is written and status says cancelled, not `exited 143`. Its own error output
    goes nowhere (a shell reports a child killed by a signal, which is not the job's
    output); the job's goes to `job.log`."""
    traps = "".join(f"trap 'rw_caught {name}' {name}\n" for name in PREEMPTION_SIGNALS)
    return f"""cd -- {quote(dir)} || exit 126
rw_caught() {{
  if [ -e {CANCELLING_FILE} ] || [ -h {CANCELLING_FILE} ]; then trap - "$1"; kill -s "$1" $$; fi
}}
{traps}printf '%s\\n' "$$" > "{PID_FILE}.tmp.$$" && "$2" -f -- "{PID_FILE}.tmp.$$" {PID_FILE}
exec 3>&2 2>/dev/null
"$1" -c {quote(script)} 2>&3 3>&- &
rw_job=$!
while :; do
  wait "$rw_job"; rw_code=$?
  if [ "$rw_code" -gt 128 ] && [ "$rw_code" != 127 ] && kill -0 "$rw_job" 2>/dev/null; then
    continue
  fi
  break
done
printf '%s\\n' "$rw_code" > "{EXIT_FILE}.tmp.$$" && "$2" -f -- "{EXIT_FILE}.tmp.$$" {EXIT_FILE}
exit "$rw_code"
"""


WATCHDOG_PID_FILE: Final = f"{JOBSIDE_DIR}/watchdog.pid"
"""Where the on-target watchdog records its pid, relative to the run directory. It
stays after the watchdog ended (like `job.pid`); spawn removes a stale one."""
_WATCHDOG_MAX_S: Final = 1e9  # about 31 years: milliseconds stay far inside sh arithmetic
_WATCHDOG_MIN_POLL_MS: Final = 10


def _watchdog_ms(name: str, seconds: float, least: int) -> int:
    if not math.isfinite(seconds) or not 0 < seconds <= _WATCHDOG_MAX_S:
        raise InvalidArgument(f"{name} is a number of seconds above 0 and at most 1e9")
    return max(least, round(seconds * 1000))


def watchdog_script(dir: str, after_s: float, poll_s: float) -> str:
    """The on-target watchdog of the job in `dir`: plain POSIX `sh` (no Python, no
    worker, no Redis), run as `sh -c` beside the job (see [`launcher_script`]). It
    asks for the `deadline` snapshot by itself when every worker is gone.

    - It takes the job's pid and its leader's start time from its arguments (`sh -c
      WATCHDOG rw-watchdog PID START`, as the launcher starts it: never from a file
      the job could rewrite); started without them, it reads the pid from `job.pid`.
      Exit 3 when that is not a pid above 1. It records its own pid in
      `.runwarden/watchdog.pid` (the folder created when missing; a temporary name
      and a rename) and moves to `/`, so it pins no directory.
    - Its fire time is `after_s` (rounded to milliseconds) after its own start, by
      the target's clock: `date +%s%N` where that gives nanoseconds (GNU), else
      `date +%s` (whole seconds: it fires within about a second of the time). When
      `date` fails, the time it slept stands in for the clock.
    - Each turn it sleeps the lesser of `poll_s` (at least 10 ms) and the time left
      (`sleep` with a fraction, else whole seconds, at least 1).
    - It exits as soon as the job has ended, checked before every write and after
      every sleep: the run directory is gone, or the job's process group is gone (as
      status decides "running": files the job writes, such as `exit_code`, do not
      count).
    - At its fire time, the job still running and no `snapshot.request` there, it
      writes `deadline` to it: a complete temporary file unique to this writer
      (shell pid and a random token), hard-linked into place, so a request that
      appears meanwhile is never replaced: the first reason is kept. Only where hard
      links fail and still no request exists does it rename the file into place (as
      put_file does). It never writes again, and keeps waiting for the job's end.

    Raises:
        InvalidArgument: when `after_s` or `poll_s` is not finite, above 0 and at
            most 1e9 seconds.
    """
    after_ms = _watchdog_ms("after_s", after_s, 1)
    poll_ms = _watchdog_ms("poll_s", poll_s, _WATCHDOG_MIN_POLL_MS)
    token = _secrets.token_hex(6)
    return (
        GROUP_SIGNAL
        + CLOCK
        + f"""
rw_dir={quote(dir)}
rw_after={after_ms}
rw_poll={poll_ms}
rw_pid=${{1-}}
rw_begun=${{2-}}
if [ -z "$rw_pid" ]; then IFS= read -r rw_pid < "$rw_dir/{PID_FILE}" || :; fi
case $rw_begun in *[!0-9]*) rw_begun= ;; esac
case $rw_pid in ''|*[!0-9]*) exit 3 ;; esac
if [ "${{#rw_pid}}" -gt 9 ] || [ "$rw_pid" -le 1 ]; then exit 3; fi
cd / || :
rw_w="$rw_dir/{WATCHDOG_PID_FILE}"
mkdir -p -- "$rw_dir/{JOBSIDE_DIR}" 2>/dev/null || :
if printf '%s\n' "$$" > "$rw_w.tmp.$$"; then mv -f -- "$rw_w.tmp.$$" "$rw_w" || :; fi
rm -f -- "$rw_w.tmp.$$" 2>/dev/null || :
rw_ended() {{
  [ ! -d "$rw_dir" ] || ! rw_ours "$rw_pid" "$rw_begun"
}}
rw_ask() {{
  rw_req="$rw_dir/{SNAPSHOT_REQUEST}"
  if [ -e "$rw_req" ] || [ -h "$rw_req" ]; then return 0; fi
  rw_tmp="$rw_req.rw-tmp.$$.{token}"
  if printf '%s' deadline > "$rw_tmp"; then
    if ! ln -- "$rw_tmp" "$rw_req" 2>/dev/null; then
      if [ ! -e "$rw_req" ] && [ ! -h "$rw_req" ]; then mv -f -- "$rw_tmp" "$rw_req" || :; fi
    fi
  fi
  rm -f -- "$rw_tmp" 2>/dev/null || :
}}
rw_now 0
rw_fire=$((rw_ms + rw_after))
rw_left=0
while ! rw_ended; do
  if [ -n "$rw_fire" ]; then
    rw_now "$rw_left"
    rw_left=$((rw_fire - rw_ms))
    if [ "$rw_left" -le 0 ]; then
      rw_fire=
      rw_ask
      continue
    fi
    [ "$rw_left" -le "$rw_poll" ] || rw_left=$rw_poll
  else
    rw_left=$rw_poll
  fi
  rw_sleep "$rw_left"
done
"""
    )


def launcher_script(
    dir: str,
    script: str,
    env: Mapping[str, str],
    secret_names: Sequence[str],
    watchdog: tuple[float, float] | None = None,
    *,
    notice_watcher: str | None = None,
) -> str:
    """The launcher of a job: enters `dir` (created when missing), clears stale
    `exit_code`, `cancelling`, `cancelled`, `job.pid`, `.runwarden/watchdog.pid`,
    `snapshot.request`, `snapshot.json`, and the notice watcher's `notice.json`,
    `.runwarden/notice.state` and `.runwarden/notice.pid` (a new job never inherits
    a notice), and starts the [`wrapper_script`] with
    `setsid` in its own session, stdin from /dev/null, stdout and stderr appended to
    `job.log`, SIGHUP ignored (like `nohup`).

    The job's variables (`env`, non-secret, so on the launcher's command line) and
    its secrets (one line each on the launcher's standard input, per name of
    `secret_names`; values never on a command line or in a file) are set in a
    subshell that starts the job and nothing else: they reach the job's processes
    only, never the launcher's own state, so no name (`IFS`, `PATH`, `HOME`, `rw_*`)
    can change what the launcher does. Secrets are read straight into their names.

    The wrapper's parent is a small background `sh` that only waits for it, so the
    job's session leader is reaped even on a host whose init does not reap orphans.
    It is exec'd, not forked: a forked subshell would keep the caller's saved
    descriptors (dash holds them at 10+), pipes the caller waits on among them. That
    parent tells the launcher the wrapper's pid (`$!`: never read from `job.pid`,
    which the job can rewrite); the launcher returns once the wrapper wrote
    `job.pid` (or the job already removed its run directory), printing `<pid>
    <start>`: the pid and the leader's start time in clock ticks (empty without
    `/proc`). Exit 6 when the wrapper ended before it wrote `job.pid` (it could not
    enter the run directory) or did not write it within 10 s.

    With `watchdog` = `(after_s, poll_s)`, it also starts the [`watchdog_script`] the
    same way (`setsid`, SIGHUP ignored, a waiting parent `sh`), in a session of its
    own: never a member of the job's process group, so status never sees it as the
    job and cancel never signals it. It gets the job's pid and start time as
    arguments; its stdin, stdout and stderr are /dev/null, and it never has the job's
    variables or secrets.

    With `notice_watcher` (the text of `notices.notice_watch_script` for `dir`), it
    starts that preemption-notice watcher exactly as the watchdog: its own session,
    SIGHUP ignored, a waiting parent `sh`, the job's pid and start time as
    arguments, stdio on /dev/null, none of the job's variables or secrets. Like the
    job, it outlives whoever started it (the worker, Redis, every Celery process),
    and it ends with the job's process group or the run directory.

    The caller validates names and values (`schemas.check_env_name`,
    `check_secret_value`).
    """
    exports = "".join(f"  {name}={quote(value)}; export {name}\n" for name, value in env.items())
    reads = "".join(
        f"  IFS= read -r {name} || {{ echo 'the secrets ended early' >&2; exit 4; }}\n"
        f"  export {name}\n"
        for name in secret_names
    )
    reaper = (
        'trap "" HUP; "$1" "$2" -c "$3" rw-job "$2" "$4" </dev/null >>'
        + JOB_LOG
        + ' 2>&1 & printf "%s\\n" "$!"; exec >/dev/null 2>&1; wait $!'
    )
    companions = ""
    if watchdog is not None:
        companions = (
            """"$rw_sh" -c 'trap "" HUP; "$1" "$2" -c "$3" rw-watchdog "$4" "$5" \\
  </dev/null >/dev/null 2>&1 & wait $!' rw-watchdog-parent "$rw_setsid" "$rw_sh" """
            + quote(watchdog_script(dir, *watchdog))
            + ' "$rw_pid" "$rw_st" </dev/null >/dev/null 2>&1 &\n'
        )
    if notice_watcher is not None:
        companions += (
            """"$rw_sh" -c 'trap "" HUP; "$1" "$2" -c "$3" rw-notice "$4" "$5" \\
  </dev/null >/dev/null 2>&1 & wait $!' rw-notice-parent "$rw_setsid" "$rw_sh" """
            + quote(notice_watcher)
            + ' "$rw_pid" "$rw_st" </dev/null >/dev/null 2>&1 &\n'
        )
    return (
        GROUP_SIGNAL
        + f"""rw_sh=$(command -v sh) || exit 5
rw_setsid=$(command -v setsid) || {{ echo 'setsid is not installed on the target' >&2; exit 5; }}
rw_mv=$(command -v mv) || exit 5
mkdir -p -- {quote(dir)} && cd -- {quote(dir)} || exit 3
rm -f -- {EXIT_FILE} {CANCELLING_FILE} {CANCEL_FILE} {PID_FILE} {WATCHDOG_PID_FILE} \\
  {SNAPSHOT_REQUEST} {SNAPSHOT_FILE} {NOTICE_FILE} {NOTICE_STATE_FILE} {NOTICE_PID_FILE} \\
  || exit 3
rw_pid=$(
  set -- "$rw_sh" "$rw_setsid" "$rw_mv"
{exports}{reads}  "$1" -c {quote(reaper)} rw-job-parent "$2" "$1" \\
    {quote(wrapper_script(dir, script))} "$3" </dev/null 2>/dev/null &
) || exit 4
case $rw_pid in ''|*[!0-9]*) echo 'the job did not start' >&2; exit 6 ;; esac
rw_i=0
while [ ! -s {PID_FILE} ] && [ -d {quote(dir)} ]; do
  if ! kill -0 "$rw_pid" 2>/dev/null; then echo 'the job ended before it started' >&2; exit 6; fi
  rw_i=$((rw_i + 1))
  if [ "$rw_i" -gt 200 ]; then echo 'the job did not start within 10 s' >&2; exit 6; fi
  sleep 0.05 2>/dev/null || sleep 1
done
rw_start "$rw_pid"
{companions}printf '%s %s\\n' "$rw_pid" "$rw_st"
"""
    )
