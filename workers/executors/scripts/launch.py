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
    CANCELLING_FILE,
    JOBSIDE_DIR,
    MARK_ENV,
    MARK_FORM,
    RUN_ID_ENV,
    mark_entry,
)

from ..errors import InvalidArgument
from .common import Script, sh

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
# One character or one quoted part per repetition, never a run of them: a quantified
# group of quantified runs backtracks exponentially on a command that does not match
# (a long word before a `<` took minutes).
_WORD = r"""(?:[A-Za-z0-9_./:,+@%=-]|'[^']*'|"[^"$`\\!]*")+"""
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


_COMMAND: Final = "command"
_SCRIPT: Final = "script"
"""The two modes of `sh/job_shell.sh`: `exec` of its one command (its argument), or
the script after its text, with its traps (its argument the `cancelling` marker)."""


def job_shell_script(dir: str, script: str) -> Script:
    """What the job's own shell (`sh -c`, a child of the wrapper; `sh/job_shell.sh`)
    runs for `script`, the job in `dir`: run as `SH -c TEXT SH MODE ARG` (its text
    and arguments here; `SH` the path of `sh`: `$0` is that path, as with `sh -c
    TEXT` alone), it first waits for
    the launcher's `go` on its standard input (end of input without `go`, the
    launcher gone: exit 125, nothing of the job's run). Then `exec` of `script` when
    it is one simple command ([`single_command`]): the command is then the job's
    main process and gets every signal itself; otherwise `script` (its text after
    the file's, with no positional parameter) after a trap of each of
    [`PREEMPTION_SIGNALS`] whose handler does nothing (so the shell outlives a
    signal sent to the whole group and waits for the job's commands: a trapped
    signal runs its handler only once the command in the foreground ended) unless
    the run's `cancelling` marker exists: then the shell ends by the signal, as
    runwarden's cancel wants."""
    if single_command(script):
        return Script(sh("job_shell"), (_COMMAND, script.strip(" \t")))
    marker = f"{dir.rstrip('/') or ''}/{CANCELLING_FILE}"
    return Script(sh("job_shell") + script, (_SCRIPT, marker))


def wrapper_script(
    dir: str, script: str, *, mark: str | None = None, wait_for_all: bool = False
) -> Script:
    """The job wrapper (`sh/scan.sh`, `sh/wrapper.sh`), run as `sh -c WRAPPER rw-job
    SH MV ARG...` (`ARG...` its arguments here) by the session leader of the job
    (`SH` and `MV` the absolute paths of `sh` and `mv`, so the job's own `PATH` never
    changes what the wrapper runs), its standard input the launcher's FIFO. It
    starts the job's shell (a child `sh`: [`job_shell_script`], which first waits for
    the launcher's `go` on that FIFO), then writes its own pid to `job.pid`: the
    launcher reads the wrapper's start time before it says `go`, so the leader's
    start time is read while it surely lives. Once the job's shell (the job's main
    process) ended:

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
    count as the run's. Before the job's shell started, it sets no variable but
    `rw_sh`, `rw_mv`, `rw_entry`, `rw_sig` and `rw_execd` (the job's environment may
    hold any name, which the job's shell would inherit changed).

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
    entry = mark_entry(mark) if mark is not None else ""
    job = job_shell_script(dir, script)
    # Two looks a second: each reads every process's stat and environment.
    args = (
        dir,
        entry,
        "1" if wait_for_all else "",
        str(LEFTOVER_KILL_S * 2),
        str(LEFTOVER_GIVE_UP_S * 2),
        str(WAIT_ALL_POLL_S),
        job.text,
        *job.args,
    )
    return Script(sh("scan", "wait_job", "wrapper"), args)


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


_END: Final = "--"
"""The word that ends each section of the launcher's arguments (`sh/launcher.sh`)."""


def _section(words: Sequence[str]) -> tuple[str, ...]:
    """`words` then [`_END`], as one section of the launcher's arguments.

    Raises:
        InvalidArgument: when a word is [`_END`] itself, which would end it early.
    """
    if _END in words:
        raise InvalidArgument(f"a launcher argument cannot be {_END!r}")
    return (*words, _END)


def launcher_script(
    dir: str,
    script: str,
    env: Mapping[str, str],
    secret_names: Sequence[str],
    watchdog: tuple[float, float] | None = None,
    *,
    notice_watcher: Script | None = None,
    wait_for_all: bool = False,
    cgroup: str | None = None,
) -> Script:
    """The launcher of a job (`sh/launcher.sh`): with `cgroup`, first creates that
    cgroup v2 directory and moves itself into it (exit 7 when it cannot: a job is
    never started outside the cgroup it was given), so the job and everything it
    starts are in it, whatever session or environment they make; enters `dir` (created when
    missing), clears stale `exit_code`, `cancelling`, `cancelled`, `job.pid`,
    `.runwarden/watchdog.pid`, `.runwarden/ended`, `snapshot.request`,
    `snapshot.json`, and the notice watcher's `notice.json`,
    `.runwarden/notice.state` and `.runwarden/notice.pid` (a new job never inherits
    a notice), and starts the [`wrapper_script`] with
    `setsid` in its own session, stdin from /dev/null, stdout and stderr appended to
    `job.log`, SIGHUP ignored (like `nohup`).

    The job's variables (`env`, non-secret, so on the launcher's command line, as
    its arguments) and its secrets (one line each on the launcher's standard input,
    per name of `secret_names`; values never on a command line or in a file) are set
    in a subshell that starts the job and nothing else: they reach the job's
    processes only, never the launcher's own state, so no name (`IFS`, `PATH`,
    `HOME`, `rw_*`) can change what the launcher does. Secrets are read straight
    into their names.

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

    Raises:
        InvalidArgument: for watchdog times out of range ([`watchdog_script`]), a
            word that is `--` (a secret's name, a run directory) or one holding a
            NUL byte.
    """
    mark = env.get(MARK_ENV, env.get(RUN_ID_ENV))
    wrapper = wrapper_script(
        dir,
        script,
        mark=mark if mark is not None and MARK_FORM.fullmatch(mark) else None,
        wait_for_all=wait_for_all,
    )
    dog = watchdog_script(dir, *watchdog) if watchdog is not None else Script("")
    watcher = notice_watcher if notice_watcher is not None else Script("")
    if _END in wrapper.args:
        raise InvalidArgument(f"a launcher argument cannot be {_END!r}")
    args = (
        dir,
        _secrets.token_hex(6),
        wrapper.text,
        cgroup or "",
        *_section((dog.text, *dog.args)),
        *_section((watcher.text, *watcher.args)),
        *_section([f"{name}={value}" for name, value in env.items()]),
        *_section(secret_names),
        *wrapper.args,
    )
    return Script(sh("group", "launcher"), args)
