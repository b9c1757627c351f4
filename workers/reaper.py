"""Reaping orphans: a job's processes must not linger as zombies, because a zombie
still counts as a live member of its process group (`kill -0` finds it), so cancel
would wait for it in vain and status would say running.

A job's session leader is reaped by the small subshell that started it (see
`launcher_script`). Processes of the job that outlive their parent are re-parented
to the nearest *child subreaper* ancestor, or to init. Init reaps on an ordinary
host, but not on every machine (some container and VM inits do not): a process that
starts jobs and must see them end (the worker, the test suite) declares itself a
subreaper with [`become_subreaper`] and reaps its jobs' groups (see
`LocalTransport.reap`).

`python -m workers.reaper -- CMD...` runs CMD under a subreaper that reaps every
orphan, and exits with CMD's exit code: the test command runs pytest under it. CMD
gets SIGTERM when the reaper dies, however it dies (its parent-death signal,
`workers.deathsig`): a command never outlives its reaper.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Final

from .deathsig import die_with_parent

__all__ = ["become_subreaper", "is_subreaper", "main", "supervise"]

_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_GET_CHILD_SUBREAPER: Final = 37


def _prctl(option: int, arg: int | ctypes.c_int) -> int:
    libc_name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or libc_name is None:
        return -1
    libc = ctypes.CDLL(libc_name, use_errno=True)
    result: int = libc.prctl(option, arg, 0, 0, 0)
    return result


def become_subreaper() -> bool:
    """Makes this process a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): orphans
    of its descendants are re-parented to it rather than to init. Returns whether it
    worked (False off Linux). The caller must then reap them."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0


def is_subreaper() -> bool:
    """Whether this process is a child subreaper."""
    value = ctypes.c_int(0)
    if _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(value)) != 0:
        return False
    return value.value != 0


def supervise(start: Callable[[], int], restart: bool, name: str) -> int:
    """Reaps every orphan of this process (which must be a subreaper, single-threaded)
    until the child `start()` starts (it returns the child's pid, the child already
    armed to die with this process) exits; returns its exit code (128 + signal when
    killed). SIGINT and SIGTERM are passed on to the child.

    With `restart`, a child that ends on its own with a non-zero code is started
    again (after 1 s, doubling to 30 s; reset after a minute of running), its end
    said on stderr under `name`. A child ended by a forwarded signal is not
    restarted."""
    stopping = False
    child = start()

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    backoff_s, started = 1.0, time.monotonic()
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid != child:
            continue  # an orphan, reaped
        code = os.waitstatus_to_exitcode(status)
        if not restart or stopping or code == 0:
            return 128 - code if code < 0 else code
        if time.monotonic() - started > 60:
            backoff_s = 1.0
        print(f"reaper: {name} exited with {code}; restarting in {backoff_s:g} s",
              file=sys.stderr, flush=True)  # fmt: skip
        time.sleep(backoff_s)
        backoff_s = min(30.0, backoff_s * 2)
        if stopping:
            return 128 - code if code < 0 else code
        started = time.monotonic()
        child = start()


def main(argv: list[str] | None = None) -> int:
    """Runs the command after `--` as a child of a subreaper that reaps every orphan
    until the command exits ([`supervise`]); returns its exit code.

    With `--restart` before `--`, a command that ends on its own with a non-zero
    code is started again: a Celery worker exits on an "unrecoverable" broker error
    (kombu fails to reconnect after some Redis restarts), and the stops in flight
    depend on a worker coming back."""
    args = sys.argv[1:] if argv is None else argv
    restart = False
    if args[:1] == ["--restart"]:
        restart, args = True, args[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m workers.reaper [--restart] -- CMD [ARG...]", file=sys.stderr)
        return 2
    become_subreaper()
    me = os.getpid()

    def arm() -> None:
        # Between fork and exec of this single-threaded process: a command whose reaper
        # is already gone would never get the signal, so it does not start.
        die_with_parent(signal.SIGTERM)
        if os.getppid() != me:
            os._exit(1)

    def start() -> int:
        child = subprocess.Popen(args, preexec_fn=arm)  # noqa: PLW1509 - no thread here
        # Reaped by supervise's os.wait, never by Popen (which would wait on a pid
        # that may by then be another process's).
        child.returncode = 0
        return child.pid

    return supervise(start, restart, args[0])


if __name__ == "__main__":
    sys.exit(main())
