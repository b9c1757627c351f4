"""Service processes started warm: the harness's Celery workers and beat are real
processes running `workers.start` (each worker under its reaper, `workers.reaper`,
as `runwarden serve` runs it), forked from a server process that has already
imported Celery, kombu, redis-py, pydantic and every module of `workers` but the app
(multiprocessing's `forkserver`, with those modules preloaded), rather than started
with `exec` and importing all of it again: 1.0-1.2 s of CPU less at each start, on a
2-core machine whose test suite starts about 190 of them.

What differs from an `exec` start, and why it does not matter here:

- The app (`workers.app`, `workers.tasks`, `workers.beat`) is imported in the
  started process, after its environment is set, so it reads its own settings: no
  module that reads the environment at import is preloaded (the app's modules are
  the only ones in `workers`; [`start`] refuses to run if one came in).
- The process is a child of the fork server, not of the test: [`Warm`] gives what
  the tests use of a `subprocess.Popen` (pid, poll, wait, signals), and its session
  is its own (`setsid`), as `start_new_session` gave. It dies with the fork server
  (its parent-death signal), which dies with the test process. It joins the cgroup
  (v2) of the process that started it, where it can, as an exec'd child would be
  in it (`tests/cpu_by_module.py` counts a module's processes by their cgroup).

`runwarden serve` still starts every process with `exec` (`producers/children.py`),
and its tests (test_supervisor.py, test_cli.py's serve and demo) cover that path.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pkgutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Final

import workers
from workers.deathsig import die_with_parent
from workers.reaper import become_subreaper, supervise

__all__ = ["APP_MODULES", "Warm", "preload", "start"]

APP_MODULES: Final = frozenset({"workers.app", "workers.tasks", "workers.beat", "workers.start"})
"""The modules that read the settings (the environment) when imported: never preloaded."""
_LIBRARIES: Final = (
    "celery",
    "celery.apps.worker",
    "celery.apps.beat",
    "celery.beat",
    "celery.worker.consumer",
    "celery.concurrency.prefork",
    "celery.backends.redis",
    "kombu.transport.redis",
)
_context: ForkServerContext | None = None


def preload() -> list[str]:
    """The modules the fork server imports once: the libraries a worker and beat use,
    and every module of `workers` but [`APP_MODULES`] and the job side (stdlib files
    shipped to targets, never imported by a worker)."""
    found = [
        module.name
        for module in pkgutil.walk_packages(workers.__path__, "workers.")
        if module.name not in APP_MODULES and not module.name.startswith("workers.jobside")
    ]
    return [*_LIBRARIES, *sorted(found)]


def _fork_server() -> ForkServerContext:
    global _context  # noqa: PLW0603 - one fork server per process, started lazily
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(preload())
        _context = context
    return _context


class Warm:
    """A started service process, as the tests use a `subprocess.Popen`: `pid`,
    `returncode`, `poll()`, `wait(timeout)` (raising `subprocess.TimeoutExpired`),
    `send_signal`, `terminate`, `kill`."""

    def __init__(self, process: multiprocessing.process.BaseProcess, argv: list[str]) -> None:
        self._process = process
        self.args = argv
        pid = process.pid
        assert pid is not None, "started"
        self.pid: int = pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(argv: list[str], env: Mapping[str, str], cwd: Path, log: Path, reaper: bool) -> Warm:
    """Starts `python -m workers.start ARGV` warm, in a session of its own, with the
    environment `env` (all of it, nothing of this process's), in `cwd`, its output
    appended to `log`; under a restarting reaper (`python -m workers.reaper --restart
    --`) when `reaper`."""
    order = _Order(list(argv), dict(env), str(cwd), str(log), reaper, _cgroup())
    process = _fork_server().Process(target=_run, args=(order,), daemon=False)
    process.start()
    return Warm(process, argv)


def _cgroup() -> str | None:
    """This process's cgroup v2 directory (`/proc/self/cgroup`'s `0::` line under the
    cgroup2 mount), or None."""
    with contextlib.suppress(OSError):
        line = next((x for x in Path("/proc/self/cgroup").read_text().splitlines()
                     if x.startswith("0::")), None)  # fmt: skip
        for mount in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = mount.split(" - ", 1)
            if line is not None and len(fields) == 2 and fields[1].startswith("cgroup2 "):
                return fields[0].split()[4] + line[3:].rstrip("/")
    return None


@dataclass(frozen=True)
class _Order:
    """What [`start`] sends the fork server for the process it starts."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str
    reaper: bool
    cgroup: str | None


def _run(order: _Order) -> None:
    """The started process (a child of the fork server): its cgroup, session,
    environment, directory and output, then `workers.start` (under the reaper when
    `order.reaper`)."""
    argv = order.argv
    if order.cgroup is not None and order.cgroup != _cgroup():
        with contextlib.suppress(OSError):  # not root, or no cgroup v2: stays where it is
            Path(order.cgroup, "cgroup.procs").write_text(f"{os.getpid()}\n")
    die_with_parent(signal.SIGTERM)
    os.setsid()
    os.chdir(order.cwd)
    os.environ.clear()
    os.environ.update(order.env)
    out = os.open(order.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(nothing)
    loaded = APP_MODULES & set(sys.modules)
    if loaded:
        print(f"warm start: {sorted(loaded)} preloaded: they read settings at import",
              file=sys.stderr, flush=True)  # fmt: skip
        sys.exit(70)
    if not order.reaper:
        sys.exit(_start(argv))
    become_subreaper()
    me = os.getpid()

    def fork() -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 70
        try:
            # As an exec would: the reaper's handlers (which pass signals on) are not
            # the worker's, until Celery installs its own.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            die_with_parent(signal.SIGTERM)
            if os.getppid() == me:
                code = _start(argv)
        except SystemExit as ended:
            code = ended.code if isinstance(ended.code, int) else 1
        except BaseException:  # noqa: BLE001 - said, then the exit code says it too
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # never back into the reaper's stack

    sys.exit(supervise(fork, restart=True, name="workers.start"))


def _start(argv: list[str]) -> int:
    # Only here: it imports the app, which reads this process's environment.
    from workers.start import main

    return main(argv)
