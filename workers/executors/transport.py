"""The one narrow seam between the script-driven executor and a target: run a POSIX
`sh` script there, with bytes on its stdin, and get its exit code, stdout and
stderr; or stream a tar archive in or out. [`LocalTransport`] runs scripts on this
machine; the SSH transport runs them on a remote shell.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Final, Protocol

from .errors import CommandError, InvalidArgument, ScriptTimeout, SpawnError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_SCRIPT_BYTES",
    "SCRIPT_NAME",
    "Completed",
    "LocalTransport",
    "TimeoutListener",
    "Transport",
    "error_line",
    "timed_out",
]

DEFAULT_TIMEOUT_S: Final = 120.0
"""Deadline of a small operation's script, in seconds: no call waits for ever."""
MAX_SCRIPT_BYTES: Final = 120 * 1024
"""Largest script a transport takes, its text and its arguments together: Linux caps
one argument at 128 KiB."""
SCRIPT_NAME: Final = "rw"
"""A script's `$0` (`sh -c SCRIPT rw ARG...`)."""


def check_size(script: str, args: Sequence[str], action: str) -> None:
    """Checks that `script` and `args` can be passed to a shell.

    Raises:
        InvalidArgument: an argument holding a NUL byte (no shell word can).
        CommandError: when they are more than [`MAX_SCRIPT_BYTES`].
    """
    size = len(script.encode())
    for arg in args:
        if "\0" in arg:
            raise InvalidArgument("a shell argument cannot hold a NUL byte")
        size += len(arg.encode()) + 1
    if size > MAX_SCRIPT_BYTES:
        raise CommandError(action, f"script of {size} bytes is too long")


@dataclass(frozen=True)
class Completed:
    """A script that ran to its end."""

    exit_code: int
    stdout: bytes
    stderr: bytes


def error_line(stderr: bytes, exit_code: int, limit: int = 500) -> str:
    """A script's error output as one bounded line for a person: control characters
    dropped, lines joined with `; `, cut to `limit` characters; `exit status N` when
    it wrote nothing."""
    text = stderr.decode("utf-8", "replace")
    parts = ["".join(c for c in line if c.isprintable()).strip() for line in text.splitlines()]
    joined = "; ".join(p for p in parts if p)
    if not joined:
        return f"exit status {exit_code}"
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


class Transport(Protocol):
    """Runs scripts on one target. Implementations take concurrent calls from several
    threads (a retrieval runs the manifest while it downloads), and open lazily: the
    first call connects."""

    on_timeout: TimeoutListener | None
    """Told the action of each script [`run`] or [`run_to_end`] ends at its deadline,
    before the [`ScriptTimeout`] is raised (the worker counts them,
    `runwarden_script_timeouts_total`). It must not raise."""

    def run(
        self,
        script: str,
        *,
        action: str,
        stdin: bytes = b"",
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        args: Sequence[str] = (),
    ) -> Completed:
        """Runs `script` to its end, `stdin` on its standard input then EOF, with
        `args` as its positional parameters (`sh -c SCRIPT rw ARG...`: a value
        reaches a script only so, or on its standard input, never in its text).

        Raises:
            ScriptTimeout: when it does not end within `timeout_s` (then it is killed).
            ExecError: when the target cannot be reached.
        """
        ...

    def run_to_end(
        self,
        script: str,
        *,
        action: str,
        pgid: int | None = None,
        timeout_s: float | None = None,
        args: Sequence[str] = (),
    ) -> Completed:
        """Runs `script` (with `args`, as [`run`]) to its end, never interrupted
        midway (a Ctrl-C reaching this process is delivered once the script ended),
        for at most `timeout_s` seconds (None: no deadline). While it runs, members
        of the process group `pgid` that are this process's children are reaped.
        Used by cancel, whose script is idempotent: one cut at its deadline is tried
        again.

        Raises:
            ScriptTimeout: when it does not end within `timeout_s` (a local script is
                killed; a remote one is left to end by itself).
            ExecError: when the target cannot be reached.
        """
        ...

    def send(
        self,
        script: str,
        *,
        action: str,
        source: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
        """Runs `script` (with `args`, as [`run`]) with what `source` writes on its
        standard input (a stream: an archive to unpack), then EOF."""
        ...

    def receive(
        self,
        script: str,
        *,
        action: str,
        sink: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
        """Runs `script` (with `args`, as [`run`]) and hands its standard output, as
        a stream, to `sink`; what the sink leaves unread is drained."""
        ...

    def reap(self, pgid: int) -> None:
        """Reaps the members of process group `pgid` that are this process's children
        (nothing for a remote target)."""
        ...

    def close(self) -> None:
        """Releases every resource; the next call opens again."""
        ...


TimeoutListener = Callable[[str], None]
"""Told the action of a script that passed its deadline ([`Transport.on_timeout`])."""


def timed_out(
    listener: TimeoutListener | None, action: str, timeout_s: float | None
) -> ScriptTimeout:
    """The [`ScriptTimeout`] of the script `action` past its deadline of `timeout_s`,
    once `listener` (when any) was told."""
    if listener is not None:
        listener(action)
    return ScriptTimeout(action, timeout_s)


class LocalTransport:
    """Runs scripts with this machine's `sh`, each in its own session, so a Ctrl-C at
    the terminal never reaches a script half way (cancel must run to its end)."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        shell: Sequence[str] = ("sh",),
        cwd: str | None = None,
    ) -> None:
        """`env` is the scripts' environment (default: this process's); `shell` the
        command that runs a script given after `-c` (default `sh`; the tests also use
        `busybox sh`; a run-as target puts the change of user in front of it); `cwd`
        the directory scripts start in (default: this process's)."""
        self._env = dict(env) if env is not None else None
        self._shell = list(shell)
        self._cwd = cwd
        self._groups: set[int] = set()
        self._running: set[int] = set()
        """Scripts not waited for yet: their groups are left to the thread running them
        (reaping one here would make its `wait` read exit status 0)."""
        self._lock = threading.Lock()
        self.on_timeout: TimeoutListener | None = None

    def _popen(
        self,
        script: str,
        *,
        stdin: int,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        """Starts `script` with this transport's shell, behind the command `prefix`
        (which execs what follows it) when given."""
        check_size(script, args, "run")
        try:
            proc = subprocess.Popen(
                [*prefix, *self._shell, "-c", script, SCRIPT_NAME, *args],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=dict(env) if env is not None else self._env,
                cwd=self._cwd,
                close_fds=True,
            )
        except OSError as error:
            raise SpawnError("sh", error) from error
        with self._lock:
            self._groups.add(proc.pid)
            self._running.add(proc.pid)
        return proc

    def run(
        self,
        script: str,
        *,
        action: str,
        stdin: bytes = b"",
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> Completed:
        """As [`Transport.run`]; `env`, when given, is the script's whole environment
        (spawn passes the job's filtered one)."""
        proc = self._popen(
            script, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, env=env, args=args
        )
        # `communicate(timeout=...)` waits for the exit by polling with sleeps, which
        # doubles the cost of a small script; a timer enforces the deadline instead.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            self._kill(proc)

        timer = threading.Timer(timeout_s, expire) if timeout_s is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            out, err = proc.communicate(stdin or None)
        except BaseException:
            self._kill(proc)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._reap_scripts(proc)
        if expired.is_set():
            raise timed_out(self.on_timeout, action, timeout_s)
        return Completed(proc.returncode, out, err)

    def run_to_end(
        self,
        script: str,
        *,
        action: str,
        pgid: int | None = None,
        timeout_s: float | None = None,
        args: Sequence[str] = (),
    ) -> Completed:
        proc = self._popen(script, stdin=subprocess.DEVNULL, args=args)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        interrupted: BaseException | None = None
        expired = False
        out = err = b""
        while True:
            try:
                out, err = proc.communicate(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if pgid is not None:
                    self.reap(pgid)
                if deadline is not None and not expired and time.monotonic() > deadline:
                    # Past its deadline: the script's whole session is killed (never the
                    # job, in a group of its own), and the wait goes on to reap it.
                    expired = True
                    self._kill(proc)
            except KeyboardInterrupt as error:  # finish the cancel first, then raise
                interrupted = error
        if pgid is not None:
            self.reap(pgid)
        self._reap_scripts(proc)
        if interrupted is not None:
            raise interrupted
        if expired:
            raise timed_out(self.on_timeout, action, timeout_s)
        return Completed(proc.returncode, out, err)

    def send(
        self,
        script: str,
        *,
        action: str,
        source: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
        proc = self._popen(script, stdin=subprocess.PIPE, args=args)
        assert proc.stdin is not None
        outputs = _Drain(proc)
        try:
            with contextlib.suppress(BrokenPipeError):
                # A script that ended early closed the pipe: its exit code and stderr
                # say why, below.
                source(proc.stdin)
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        except BaseException:
            self._kill(proc)
            raise
        finally:
            proc.wait()
            outputs.join()
            self._reap_scripts(proc)
        return Completed(proc.returncode, outputs.stdout, outputs.stderr)

    def receive(
        self,
        script: str,
        *,
        action: str,
        sink: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
        proc = self._popen(script, stdin=subprocess.DEVNULL, args=args)
        assert proc.stdout is not None
        outputs = _Drain(proc, stdout=False)
        try:
            sink(proc.stdout)
            while proc.stdout.read(1024 * 1024):
                pass  # what the sink left unread must not block the script
        except BaseException:
            self._kill(proc)
            raise
        finally:
            proc.wait()
            outputs.join()
            self._reap_scripts(proc)
        return Completed(proc.returncode, b"", outputs.stderr)

    def reap(self, pgid: int) -> None:
        """Reaps every exited child of this process in the process group `pgid`."""
        while True:
            try:
                pid, _ = os.waitpid(-pgid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _reap_scripts(self, done: subprocess.Popen[bytes] | None = None) -> None:
        # A launcher leaves a waiting subshell in its own group; once it ends it is
        # re-parented here (when this process is a subreaper) and must be reaped. A
        # group with no child of ours left is forgotten.
        with self._lock:
            if done is not None:
                self._running.discard(done.pid)
            groups = [pgid for pgid in self._groups if pgid not in self._running]
        for pgid in groups:
            try:
                while os.waitpid(-pgid, os.WNOHANG)[0] != 0:
                    pass
            except ChildProcessError:
                with self._lock:
                    self._groups.discard(pgid)

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILLs the script's whole session group; the caller's wait reaps it."""
        if proc.returncode is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, 9)

    def close(self) -> None:
        self._reap_scripts()


class _Drain:
    """Reads a process's stderr (and stdout unless told not to) on threads, so a
    script writing much to one pipe never blocks while the other is being used."""

    def __init__(self, proc: subprocess.Popen[bytes], *, stdout: bool = True) -> None:
        self.stdout = b""
        self.stderr = b""
        self._threads = [threading.Thread(target=self._err, args=(proc,), daemon=True)]
        if stdout:
            self._threads.append(threading.Thread(target=self._out, args=(proc,), daemon=True))
        for thread in self._threads:
            thread.start()

    def _err(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        self.stderr = proc.stderr.read()

    def _out(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.stdout = proc.stdout.read()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()
