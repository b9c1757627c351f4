"""Starting a job: the launcher that detaches it into its own session, the wrapper that
records its pid and exit code, and the on-target watchdog that asks for its
`deadline` snapshot with every worker gone."""

from __future__ import annotations

import math
import re
import secrets as _secrets
from collections.abc import Mapping, Sequence
from typing import Final

from schemas.protocol import (
    CANCEL_FILE,
    CANCELLING_FILE,
    END_FILE,
    EXIT_FILE,
    JOB_LOG,
    JOBSIDE_DIR,
    NOTICE_FILE,
    NOTICE_PID_FILE,
    NOTICE_STATE_FILE,
    PID_FILE,
    RUN_ID_ENV,
    SNAPSHOT_FILE,
    SNAPSHOT_REQUEST,
)

from ..errors import InvalidArgument
from .common import GROUP_SIGNAL, Script, quote, sh

__all__ = [
    "LEFTOVER_GIVE_UP_S",
    "LEFTOVER_KILL_S",
    "PREEMPTION_SIGNALS",
    "WAIT_ALL_POLL_S",
    "WATCHDOG_PID_FILE",
    "job_shell_script",
    "launcher_script",
    "single_command",
    "watchdog_script",
    "wrapper_script",
]

PREEMPTION_SIGNALS: Final = ("TERM", "USR1", "USR2", "XCPU")
"""Signals the job wrapper outlives, and the job's own shell too when the command is
not one simple command (a trap with a handler, never an ignore: a child resets a
caught signal to its default action when it execs, so every process of the job
still gets them as it would without runwarden): a signal sent to the whole process
group (a systemd stop, Slurm's `--signal` without `B:`, Kubernetes' SIGTERM to a pod)
then reaches the job, which may save and exit, and the wrapper still records the
job's exit code, never its own death."""

LEFTOVER_KILL_S: Final = 10
"""How long the wrapper waits for the run's leftover processes after SIGTERM before
it sends SIGKILL, in seconds (cancel's wait)."""
LEFTOVER_GIVE_UP_S: Final = 20
"""How long after its SIGTERM the wrapper stops waiting for leftover processes that
survive SIGKILL, in seconds; they are then counted as survived."""
WAIT_ALL_POLL_S: Final = 1
"""How often the wrapper of a `wait_for_all` job looks for the run's processes left,
in seconds."""

_MARK: Final = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_BUILTINS: Final = frozenset(
    """! . : [ [[ ]] { } alias autoload bg bind break builtin caller case cd chdir command
    compgen complete compopt continue coproc declare dirs disown do done echo elif else
    enable esac eval exec exit export false fc fg fi for function getopts hash help
    history if in integer jobs kill let local logout mapfile popd print printf pushd pwd
    read readarray readonly return select set shift shopt source suspend test then time
    times trap true type typeset ulimit umask unalias unset until wait whence while""".split()  # noqa: SIM905
)
"""Words that a shell may run itself (builtins, keywords, across dash, bash, busybox
and ksh): a command starting with one is never `exec`ed (`exec cd` is not `cd`)."""
_FIRST = r"[A-Za-z0-9_./+][A-Za-z0-9_./+-]*"
_WORD = r"""(?:[A-Za-z0-9_./:,+@%=-]+|'[^']*'|"[^"$`\\!]*")+"""
_SINGLE_COMMAND: Final = re.compile(rf"[ \t]*{_FIRST}(?:[ \t]+{_WORD})*[ \t]*")


def single_command(script: str) -> bool:
    """Whether `script` is one simple command that `exec` runs exactly as the shell
    would: a first word of letters, digits and `_./+-` (no `=`, not starting with `-`)
    that is no shell builtin or keyword, then words of the same plain characters (and
    `:,@%=`), each part possibly in single quotes (anything but `'`) or double quotes
    (no `$`, backquote, backslash or `!`), separated by spaces or tabs. Anything else
    (an operator, a redirection, an expansion, a glob, a comment, a newline, a
    variable assignment, a builtin) is not, so it is never `exec`ed: a string whose
    meaning `exec` could change is always run by a shell that waits for it."""
    match = _SINGLE_COMMAND.fullmatch(script)
    if match is None:
        return False
    first = script.split(None, 1)[0]
    return first not in _BUILTINS


def job_shell_script(dir: str, script: str) -> str:
    """What the job's own shell (`sh -c`, a child of the wrapper) runs for `script`:
    `exec` of it when it is one simple command ([`single_command`]): the command is
    then the job's main process and gets every signal itself; otherwise `script`
    after a trap of each of [`PREEMPTION_SIGNALS`] whose handler does nothing (so the
    shell outlives a signal sent to the whole group and waits for the job's commands:
    a trapped signal runs its handler only once the command in the foreground ended)
    unless the run's `cancelling` marker exists: then the shell ends by the signal,
    as runwarden's cancel wants."""
    if single_command(script):
        return "exec " + script.strip(" \t")
    marker = quote(f"{dir.rstrip('/') or ''}/{CANCELLING_FILE}")
    traps = "".join(
        "trap "
        + quote(f"if [ -e {marker} ] || [ -h {marker} ]; then trap - {name}; kill -s {name} $$; fi")
        + f" {name}\n"
        for name in PREEMPTION_SIGNALS
    )
    return traps + script


_AWAIT_GO: Final = """rw_go=
IFS= read -r rw_go || rw_go=
exec </dev/null
[ "$rw_go" = go ] || exit 125
"""
# The first lines of the job's shell: it waits for the launcher's `go` on its standard
# input (the launcher's FIFO) before it runs anything of the job's.

_PROCESS_SCAN: Final = r"""
rw_scan() {
  rw_left=
  if [ -r "/proc/$$/stat" ]; then
    for rw_f in /proc/[0-9]*/stat; do
      rw_l=; { IFS= read -r rw_l < "$rw_f"; } 2>/dev/null || continue
      rw_p=${rw_f#/proc/}; rw_p=${rw_p%/stat}
      rw_l=${rw_l##*) }
      set -f; set -- $rw_l; set +f
      [ "$#" -ge 3 ] && [ "$3" = "$$" ] && [ "$1" != Z ] && [ "$2" != "$$" ] || continue
      [ "$rw_p" = "$$" ] || rw_left="$rw_left $rw_p"
    done
    if [ -n "$rw_entry" ]; then
      for rw_f in $(grep -lsxzF -- "$rw_entry" /proc/[0-9]*/environ 2>/dev/null); do
        rw_p=${rw_f#/proc/}; rw_p=${rw_p%/environ}
        case $rw_p in ''|*[!0-9]*) continue ;; esac
        [ "$rw_p" != "$$" ] && [ "$rw_p" != "$PPID" ] && [ "$rw_p" -gt 1 ] || continue
        case " $rw_left " in *" $rw_p "*) continue ;; esac
        rw_l=; { IFS= read -r rw_l < "/proc/$rw_p/stat"; } 2>/dev/null || continue
        rw_l=${rw_l##*) }
        set -f; set -- $rw_l; set +f
        # A subshell of this wrapper (the grep's) still has the mark in its environ.
        [ "$#" -ge 2 ] && [ "$1" != Z ] && [ "$2" != "$$" ] || continue
        rw_left="$rw_left $rw_p"
      done
    fi
  else
    rw_l=$(ps -A -o pid= -o ppid= -o pgid= -o stat= 2>/dev/null) || return 1
    rw_old=$IFS; IFS='
'
    for rw_f in $rw_l; do
      IFS=$rw_old
      set -f; set -- $rw_f; set +f
      [ "$#" -ge 4 ] && [ "$3" = "$$" ] && [ "$1" != "$$" ] && [ "$2" != "$$" ] || continue
      case $4 in Z*) continue ;; esac
      rw_left="$rw_left $1"
    done
    IFS=$rw_old
  fi
  return 0
}
rw_count() { set -f; set -- $1; set +f; rw_n=$#; }
"""
"""`rw_scan` sets `rw_left` to the pids of the run's processes other than the wrapper
and its own helpers: the members of the wrapper's process group (not the wrapper,
not its children, not zombies), and with `/proc` every process whose environment
holds `$rw_entry` (the run's mark; not the wrapper, not its parent, not its children,
whose environment a fork copied, not zombies, pid 1 never).
Without `/proc`, the group's members come from `ps` (POSIX `-o`), and marks cannot be
read; exit 1 when `ps` fails too. `rw_count LIST` sets `rw_n` to its words."""


def wrapper_script(
    dir: str, script: str, *, mark: str | None = None, wait_for_all: bool = False
) -> str:
    """The job wrapper, run as `sh -c WRAPPER rw-job SH MV` by the session leader of
    the job (`SH` and `MV` the absolute paths of `sh` and `mv`, so the job's own
    `PATH` never changes what the wrapper runs), its standard input the launcher's
    FIFO. It starts the job's shell (a child `sh`: [`job_shell_script`] after lines
    that wait for the launcher's `go` on that FIFO; end of input without `go`, the
    launcher gone: exit 125, nothing of the job's run), then writes its own pid to
    `job.pid`: the launcher reads the wrapper's start time before it says `go`, so
    the leader's start time is read while it surely lives. Once the job's shell (the
    job's main process) ended:

    - by default, it ends the run's leftover processes (`rw_scan`: its process group
      and every process carrying `RUNWARDEN_RUN_ID=<mark>`): SIGTERM to each (also
      to those that appear meanwhile), SIGKILL after [`LEFTOVER_KILL_S`], given up
      after [`LEFTOVER_GIVE_UP_S`];
    - with `wait_for_all`, it waits (a look every [`WAIT_ALL_POLL_S`]) until no such
      process is left;

    then writes `.runwarden/ended` (`signal NAME` for a code above 128, `leftovers
    N`, `survived N` or `waited N`; only when one applies) and the main process's
    exit code to `exit_code`, last (each through a temporary name and a rename): so
    `exited` means none of the run's processes it can see is left. It drops the mark
    from its own environment once the job's shell started, so its helpers never
    count as the run's.

    It outlives [`PREEMPTION_SIGNALS`] (a signal caught while it waits ends the
    `wait`, not the job, so it waits again while the job runs; the exit code is the
    job's, never that of the interrupted `wait`), except when the `cancelling`
    marker exists: runwarden's cancel then ends it, after it sent the signal once
    more to the whole group a second later while the job's own shell or any other
    member of the group still runs (a process that shell forked just then may have
    lost the first, and a background one outlives a shell that ended at once; it
    waits no longer than the group lives; a job whose shell execed its command gets
    no second), so no exit code is written and status says
    cancelled, not `exited 143`. Its own error output goes nowhere (a shell reports
    a child killed by a signal, which is not the job's output); the job's goes to
    `job.log`."""
    traps = "".join(f"trap 'rw_caught {name}' {name}\n" for name in PREEMPTION_SIGNALS)
    entry = quote(f"{RUN_ID_ENV}={mark}") if mark is not None else "''"
    # Two looks a second: each reads every process's stat and environment, and many
    # runs may end at once on one machine.
    kill_ticks = LEFTOVER_KILL_S * 2
    give_up_ticks = LEFTOVER_GIVE_UP_S * 2
    if wait_for_all:
        after = f"""rw_seen=
while rw_scan && [ -n "$rw_left" ]; do
  for rw_p in $rw_left; do
    case " $rw_seen " in *" $rw_p "*) ;; *) rw_seen="$rw_seen $rw_p" ;; esac
  done
  sleep {WAIT_ALL_POLL_S}
done
rw_count "$rw_seen"
[ "$rw_n" = 0 ] || rw_end="${{rw_end}}waited $rw_n
"
"""
    else:
        after = f"""rw_seen=
rw_i=0
while rw_scan && [ -n "$rw_left" ]; do
  for rw_p in $rw_left; do
    case " $rw_seen " in
    *" $rw_p "*) ;;
    *) rw_seen="$rw_seen $rw_p"; kill -s TERM "$rw_p" 2>/dev/null || : ;;
    esac
  done
  [ "$rw_i" -lt {kill_ticks} ] || kill -s KILL $rw_left 2>/dev/null || :
  rw_i=$((rw_i + 1))
  [ "$rw_i" -le {give_up_ticks} ] || break
  sleep 0.5 2>/dev/null || sleep 1
done
rw_count "$rw_seen"
[ "$rw_n" = 0 ] || rw_end="${{rw_end}}leftovers $rw_n
"
if [ "$rw_i" -gt {give_up_ticks} ]; then
  rw_count "$rw_left"
  rw_end="${{rw_end}}survived $rw_n
"
fi
"""
    execd = "1" if single_command(script) else ""
    return f"""cd -- {quote(dir)} || exit 126
rw_sh=$1 rw_mv=$2 rw_entry={entry} rw_sig= rw_execd={execd}
{_PROCESS_SCAN}rw_shell() {{
  # Whether process $1 still runs the job's shell: not ended (a zombie has ended),
  # not a command it execed. Without /proc it cannot be told: yes.
  kill -0 "$1" 2>/dev/null || return 1
  [ -r "/proc/$1/stat" ] || return 0
  rw_z=; {{ IFS= read -r rw_z < "/proc/$1/stat"; }} 2>/dev/null || return 1
  case ${{rw_z##*) }} in Z*) return 1 ;; esac
  rw_x=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  [ -n "$rw_real" ] || return 0
  [ "$rw_x" = "$rw_real" ]
}}
rw_others() {{
  # Whether the group holds a live process other than this wrapper, its children
  # and theirs (the job's shell, the helpers of this look). One awk over every
  # stat, not rw_scan's loop: many runs may be cancelled at once.
  if [ -r "/proc/$$/stat" ]; then
    rw_left=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v w="$$" '
      {{ p = $1; l = $0; if (!sub(/.*\\) /, "", l)) next; split(l, f, " ")
        st[p] = f[1]; pp[p] = f[2]; pg[p] = f[3] }}
      END {{ for (p in pg) if (pg[p] == w && p != w && st[p] != "Z" &&
        pp[p] != w && pp[pp[p]] != w) {{ print p; exit }} }}')
  else
    rw_e=$rw_entry; rw_entry=; rw_scan; rw_entry=$rw_e
  fi
  [ -n "$rw_left" ]
}}
rw_caught() {{
  rw_sg=$1
  if [ -e {CANCELLING_FILE} ] || [ -h {CANCELLING_FILE} ]; then
    # Once more to the whole group when, a second later, the job's own shell or
    # another member still runs: a process a shell with a trap forks loses a signal
    # that comes between its fork and exec (a background one outlives a shell that
    # ended at once). A job that is one command (execed) gets one; a group that
    # emptied is kept no longer. At most two looks at every process: many runs may
    # be cancelled at once.
    trap '' "$rw_sg"; rw_w=0
    if [ -z "$rw_execd" ]; then
      rw_real=$(readlink -f "$rw_sh" 2>/dev/null) || rw_real=
      while [ "$rw_w" -lt 10 ] && rw_shell "$rw_job"; do
        sleep 0.1 2>/dev/null || sleep 1; rw_w=$((rw_w + 1))
      done
      if rw_shell "$rw_job"; then
        kill -s "$rw_sg" 0
      elif rw_others; then
        rw_w=$((10 - rw_w))
        sleep "$((rw_w / 10)).$((rw_w % 10))" 2>/dev/null || sleep 1
        if rw_others; then kill -s "$rw_sg" 0; fi
      fi
    fi
    trap - "$rw_sg"; kill -s "$rw_sg" $$
  fi
  rw_sig=1
}}
{traps}exec 5<&0 </dev/null 3>&2 2>/dev/null
"$rw_sh" -c {quote(_AWAIT_GO + job_shell_script(dir, script))} <&5 5<&- 2>&3 3>&- &
rw_job=$!
exec 5<&-
unset {RUN_ID_ENV}
printf '%s\\n' "$$" > "{PID_FILE}.tmp.$$" && "$rw_mv" -f -- "{PID_FILE}.tmp.$$" {PID_FILE}
rw_code=
while :; do
  rw_sig=
  wait "$rw_job"; rw_c=$?
  # A second wait of a child already reported answers 127 (dash): the first answer was the job's.
  if [ "$rw_c" = 127 ] && [ -n "$rw_code" ]; then break; fi
  rw_code=$rw_c
  # A code above 128 with a signal caught may be the interrupted wait's: wait again.
  [ -n "$rw_sig" ] && [ "$rw_c" -gt 128 ] || break
done
rw_end=
if [ "$rw_code" -gt 128 ]; then
  rw_name=$(kill -l "$rw_code" 2>/dev/null) || rw_name=
  case $rw_name in ''|*[!A-Z0-9]*) ;; *) rw_end="signal ${{rw_name#SIG}}
" ;; esac
fi
{after}if [ -n "$rw_end" ]; then
  printf '%s' "$rw_end" > "{END_FILE}.tmp.$$" && "$rw_mv" -f -- "{END_FILE}.tmp.$$" {END_FILE}
fi
printf '%s\\n' "$rw_code" > "{EXIT_FILE}.tmp.$$" && "$rw_mv" -f -- "{EXIT_FILE}.tmp.$$" {EXIT_FILE}
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


def watchdog_script(dir: str, after_s: float, poll_s: float) -> Script:
    """The on-target watchdog of the job in `dir`: plain POSIX `sh` (no Python, no
    worker, no Redis; `sh/watchdog.sh`), run as `sh -c` beside the job (see
    [`launcher_script`]). It asks for the `deadline` snapshot by itself when every
    worker is gone.

    - It takes the job's pid and its leader's start time from its arguments after
      its own (`sh -c WATCHDOG rw-watchdog ARG... PID START`, as the launcher starts
      it: never from a file the job could rewrite); started without them, it reads
      the pid from `job.pid`.
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
    args = (dir, str(after_ms), str(poll_ms), _secrets.token_hex(6))
    return Script(sh("group", "clock", "watchdog"), args)


def launcher_script(
    dir: str,
    script: str,
    env: Mapping[str, str],
    secret_names: Sequence[str],
    watchdog: tuple[float, float] | None = None,
    *,
    notice_watcher: Script | None = None,
    wait_for_all: bool = False,
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

    With `notice_watcher` (`notices.notice_watch_script` for `dir`), it
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
        'trap "" HUP; "$1" "$2" -c "$3" rw-job "$2" "$4" <&5 5<&- >>'
        + JOB_LOG
        + ' 2>&1 & printf "%s\\n" "$!"; exec >/dev/null 2>&1 5<&-; wait $!'
    )
    mark = env.get(RUN_ID_ENV)
    wrapper = wrapper_script(
        dir,
        script,
        mark=mark if mark is not None and _MARK.fullmatch(mark) else None,
        wait_for_all=wait_for_all,
    )
    companions = ""
    if watchdog is not None:
        dog = watchdog_script(dir, *watchdog)
        companions = (
            """"$rw_sh" -c 'trap "" HUP; rw_s=$1 rw_h=$2 rw_t=$3; shift 3
  "$rw_s" "$rw_h" -c "$rw_t" rw-watchdog "$@" </dev/null >/dev/null 2>&1 & wait $!' \\
  rw-watchdog-parent "$rw_setsid" "$rw_sh" """
            + " ".join(quote(word) for word in (dog.text, *dog.args))
            + ' "$rw_pid" "$rw_st" </dev/null >/dev/null 2>&1 &\n'
        )
    if notice_watcher is not None:
        companions += (
            """"$rw_sh" -c 'trap "" HUP; rw_s=$1 rw_h=$2 rw_t=$3; shift 3
  "$rw_s" "$rw_h" -c "$rw_t" rw-notice "$@" </dev/null >/dev/null 2>&1 & wait $!' \\
  rw-notice-parent "$rw_setsid" "$rw_sh" """
            + " ".join(quote(word) for word in (notice_watcher.text, *notice_watcher.args))
            + ' "$rw_pid" "$rw_st" </dev/null >/dev/null 2>&1 &\n'
        )
    token = _secrets.token_hex(6)
    return (
        GROUP_SIGNAL
        + f"""rw_sh=$(command -v sh) || exit 5
rw_setsid=$(command -v setsid) || {{ echo 'setsid is not installed on the target' >&2; exit 5; }}
rw_mv=$(command -v mv) || exit 5
mkdir -p -- {quote(dir)} && cd -- {quote(dir)} || exit 3
rm -f -- {EXIT_FILE} {CANCELLING_FILE} {CANCEL_FILE} {PID_FILE} {WATCHDOG_PID_FILE} \\
  {SNAPSHOT_REQUEST} {SNAPSHOT_FILE} {NOTICE_FILE} {NOTICE_STATE_FILE} {NOTICE_PID_FILE} \\
  {END_FILE} || exit 3
rw_go={JOBSIDE_DIR}/go.$$
if ! {{ mkdir -p {JOBSIDE_DIR} && rm -f -- "$rw_go" && mkfifo -m 600 "$rw_go"; }} 2>/dev/null; then
  rw_go="${{TMPDIR:-/tmp}}/rw-go.$$.{token}"
  rm -f -- "$rw_go"
  mkfifo -m 600 "$rw_go" || {{ echo 'cannot make the FIFO that starts the job' >&2; exit 5; }}
fi
exec 4<>"$rw_go" || exit 5
rw_pid=$(
  set -- "$rw_sh" "$rw_setsid" "$rw_mv" "$rw_go"
{exports}{reads}  "$1" -c {quote(reaper)} rw-job-parent "$2" "$1" \\
    {quote(wrapper)} "$3" </dev/null 5<"$4" 4>&- 2>/dev/null &
) || exit 4
rm -f -- "$rw_go"
case $rw_pid in ''|*[!0-9]*) echo 'the job did not start' >&2; exit 6 ;; esac
rw_i=0
while [ ! -s {PID_FILE} ] && [ -d {quote(dir)} ]; do
  if ! kill -0 "$rw_pid" 2>/dev/null; then echo 'the job ended before it started' >&2; exit 6; fi
  rw_i=$((rw_i + 1))
  if [ "$rw_i" -gt 200 ]; then echo 'the job did not start within 10 s' >&2; exit 6; fi
  sleep 0.05 2>/dev/null || sleep 1
done
rw_start "$rw_pid"
printf 'go\\n' >&4
exec 4>&-
{companions}printf '%s %s\\n' "$rw_pid" "$rw_st"
"""
    )
