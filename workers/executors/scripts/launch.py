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
    PID_FILE,
    SNAPSHOT_FILE,
    SNAPSHOT_REQUEST,
)

from ..errors import InvalidArgument
from .common import GROUP_SIGNAL, quote

__all__ = ["WATCHDOG_PID_FILE", "launcher_script", "watchdog_script", "wrapper_script"]

def wrapper_script(dir: str, script: str) -> str:
    """The job wrapper, run as `sh -c` by the session leader of the job: writes its own
    pid to `job.pid` first, runs `script` in a child `sh`, then writes the script's
    exit code to `exit_code` last (both through a temporary name and a rename)."""
    return f"""cd -- {quote(dir)} || exit 126
printf '%s\\n' "$$" > "{PID_FILE}.tmp.$$" && mv -f -- "{PID_FILE}.tmp.$$" {PID_FILE}
sh -c {quote(script)}
rw_code=$?
printf '%s\\n' "$rw_code" > "{EXIT_FILE}.tmp.$$" && mv -f -- "{EXIT_FILE}.tmp.$$" {EXIT_FILE}
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

    - It reads the job's pid from `job.pid` (exit 3 when that is not a pid above 1),
      records its own in `.runwarden/watchdog.pid` (the folder created when missing;
      a temporary name and a rename) and moves to `/`, so it pins no directory.
    - Its fire time is `after_s` (rounded to milliseconds) after its own start, by
      the target's clock: `date +%s%N` where that gives nanoseconds (GNU), else
      `date +%s` (whole seconds: it fires within about a second of the time). When
      `date` fails, the time it slept stands in for the clock.
    - Each turn it sleeps the lesser of `poll_s` (at least 10 ms) and the time left
      (`sleep` with a fraction, else whole seconds, at least 1).
    - It exits as soon as the job has ended, checked before every write and after
      every sleep: `exit_code` or `cancelled` exists, the run directory is gone, or no
      process of the job's group is left (`kill -0` on the group, as status decides
      "running").
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
        + f"""
rw_dir={quote(dir)}
rw_after={after_ms}
rw_poll={poll_ms}
rw_pid=
IFS= read -r rw_pid < "$rw_dir/{PID_FILE}" || :
case $rw_pid in ''|*[!0-9]*) exit 3 ;; esac
if [ "${{#rw_pid}}" -gt 9 ] || [ "$rw_pid" -le 1 ]; then exit 3; fi
cd / || :
rw_w="$rw_dir/{WATCHDOG_PID_FILE}"
mkdir -p -- "$rw_dir/{JOBSIDE_DIR}" 2>/dev/null || :
if printf '%s\n' "$$" > "$rw_w.tmp.$$"; then mv -f -- "$rw_w.tmp.$$" "$rw_w" || :; fi
rm -f -- "$rw_w.tmp.$$" 2>/dev/null || :
rw_ms=0
rw_now() {{
  # rw_ms: the clock in ms; when `date` fails, the last reading plus the $1 ms slept.
  rw_x=$(date +%s%N 2>/dev/null) || rw_x=
  case $rw_x in
  ''|*[!0-9]*)
    rw_x=$(date +%s 2>/dev/null) || rw_x=
    case $rw_x in
    ''|*[!0-9]*) rw_ms=$((rw_ms + $1)) ;;
    *) rw_ms=$((rw_x * 1000)) ;;
    esac ;;
  *) rw_ms=${{rw_x%??????}} ;;
  esac
}}
rw_sleep() {{
  rw_f=$((1000 + $1 % 1000))
  sleep "$(($1 / 1000)).${{rw_f#1}}" 2>/dev/null || sleep $((($1 + 999) / 1000))
}}
rw_ended() {{
  [ -e "$rw_dir/{EXIT_FILE}" ] || [ -e "$rw_dir/{CANCEL_FILE}" ] || [ ! -d "$rw_dir" ] ||
    ! rw_alive "$rw_pid"
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
) -> str:
    """The launcher of a job: enters `dir` (created when missing), clears stale
    `exit_code`, `cancelling`, `cancelled`, `job.pid` and `.runwarden/watchdog.pid`,
    exports `env` (non-secret, so on its command line), then
    reads one line per name of `secret_names` from its standard input and exports
    each (values never on a command line or in a file), and starts the
    [`wrapper_script`] with `setsid` in its own session, stdin from /dev/null, stdout
    and stderr appended to `job.log`, SIGHUP ignored (like `nohup`).

    The wrapper's parent is a small background `sh` that only waits for it, so the
    job's session leader is reaped even on a host whose init does not reap orphans.
    It is exec'd, not forked: a forked subshell would keep the caller's saved
    descriptors (dash holds them at 10+), pipes the caller waits on among them. The
    launcher itself returns at once, printing the job's pid once the wrapper wrote
    `job.pid` (within 10 s, else exit 6).

    With `watchdog` = `(after_s, poll_s)`, once the job's pid is known it also starts
    the [`watchdog_script`] the same way (`setsid`, SIGHUP ignored, a waiting parent
    `sh`), in a session of its own: never a member of the job's process group, so
    status never sees it as the job and cancel never signals it. Its stdin, stdout
    and stderr are /dev/null, and the secrets are unset before it starts: they reach
    the job's environment only.

    The caller validates names and values (`schemas.check_env_name`,
    `check_secret_value`).
    """
    exports = "".join(f"{name}={quote(value)}; export {name}\n" for name, value in env.items())
    reads = "".join(
        f"IFS= read -r rw_v || {{ echo 'the secrets ended early' >&2; exit 4; }}\n"
        f'{name}=$rw_v; export {name}\n'
        for name in secret_names
    )
    start_watchdog = ""
    if watchdog is not None:
        unset = f"unset {' '.join(secret_names)}\n" if secret_names else ""
        start_watchdog = (
            unset
            + """"$rw_sh" -c 'trap "" HUP; "$1" "$2" -c "$3" </dev/null >/dev/null 2>&1 & \\
  wait $!' rw-watchdog "$rw_setsid" "$rw_sh" """
            + quote(watchdog_script(dir, *watchdog))
            + " </dev/null >/dev/null 2>&1 &\n"
        )
    return f"""rw_sh=$(command -v sh) || exit 5
rw_setsid=$(command -v setsid) || {{ echo 'setsid is not installed on the target' >&2; exit 5; }}
mkdir -p -- {quote(dir)} && cd -- {quote(dir)} || exit 3
rm -f -- {EXIT_FILE} {CANCELLING_FILE} {CANCEL_FILE} {PID_FILE} {WATCHDOG_PID_FILE} \\
  {SNAPSHOT_REQUEST} {SNAPSHOT_FILE} || exit 3
{exports}{reads}rw_v=
"$rw_sh" -c 'trap "" HUP; "$1" "$2" -c "$3" </dev/null >>{JOB_LOG} 2>&1 & wait $!' \\
  rw-reaper "$rw_setsid" "$rw_sh" {quote(wrapper_script(dir, script))} </dev/null >/dev/null 2>&1 &
rw_i=0
while [ ! -s {PID_FILE} ]; do
  rw_i=$((rw_i + 1))
  if [ "$rw_i" -gt 200 ]; then echo 'the job did not start within 10 s' >&2; exit 6; fi
  sleep 0.05 2>/dev/null || sleep 1
done
{start_watchdog}IFS= read -r rw_pid < {PID_FILE} && printf '%s\\n' "$rw_pid"
"""
