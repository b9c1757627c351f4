"""The [`Transport`](..transport.Transport) of an SSH target: small scripts on
persistent shells, stdin-fed and streaming scripts on exec channels; idempotent
operations retried once on a broken connection.

A target whose jobs run as another user (`TargetConfig.run_as`) logs in as its
control user and runs every script as the jobs' user through `sudo -n -u USER --
env -i <the user's least environment> sh -c SCRIPT`, but the control scripts (the
user check, the jobs' leaders: `run(..., control=True)`), which the jobs' user can
neither signal nor read the output of."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Final

import paramiko

from schemas import check_user_name
from schemas.protocol import user_environment

from ..errors import CommandError, InvalidArgument, ScriptTimeout, SshError
from ..scripts import quote
from ..scripts.common import sh
from ..transport import (
    DEFAULT_TIMEOUT_S,
    SCRIPT_NAME,
    Completed,
    TimeoutListener,
    check_size,
    error_line,
    timed_out,
)
from .config import SshDestination
from .connection import CHUNK, WINDOW_SIZE, SshConnection, connection_pool

__all__ = ["SshTransport"]

_NOT_IDEMPOTENT: Final = frozenset({"spawn", "upload"})
_READY_TIMEOUT_S: Final = 30.0
"""Deadline of the check that sudo runs scripts as the jobs' user, in seconds."""
_EXEC_ARGS: Final = 'exec "$@"'
"""A script that runs its arguments: the command in front of the real script."""


def sh_command(script: str, args: Sequence[str] = ()) -> str:
    """The remote command line running `script` with `args` as its positional
    parameters (`sh -c SCRIPT rw ARG...`), every word quoted."""
    return " ".join(["sh -c", quote(script), SCRIPT_NAME, *(quote(a) for a in args)])


def _user_name(name: str) -> str:
    try:
        return check_user_name(name)
    except ValueError as error:
        raise InvalidArgument(str(error)) from error


def _translate(error: BaseException) -> SshError:
    if isinstance(error, SshError):
        return error
    if isinstance(error, (TimeoutError, socket.timeout)):
        return SshError("disconnected", "the connection stopped answering")
    return SshError("disconnected", f"the connection broke: {error}")


class SshTransport:
    """The [`Transport`](transport.Transport) of an SSH target: small scripts on
    persistent shells, stdin-fed and streaming scripts on exec channels."""

    def __init__(
        self, destination: SshDestination, retries: int = 1, run_as: str | None = None
    ) -> None:
        """`run_as`: the user every script but a control one runs as (see the module
        docstring); checked before the first such script, and again after a failed
        check: the user exists, is neither root nor the login user, and `sudo -n`
        runs a script as it.

        Raises:
            InvalidArgument: for a `run_as` that is no user name.
        """
        self.destination = destination
        self.retries = retries
        self.on_timeout: TimeoutListener | None = None
        self.run_as = None if run_as is None else _user_name(run_as)
        self._as_user: list[str] | None = None
        self._ready_lock = threading.Lock()
        self._entering = threading.local()

    @property
    def connection(self) -> SshConnection:
        return connection_pool().get(self.destination)

    def _attempt(self, action: str, call: Callable[[SshConnection], Completed]) -> Completed:
        attempts = 1 if action in _NOT_IDEMPOTENT else 1 + self.retries
        for attempt in range(attempts):
            connection = self.connection
            used: paramiko.Transport | None = None
            try:
                used = connection.open()
                return call(connection)
            except SshError as error:
                if error.kind in ("connect", "host_key", "auth") or attempt + 1 == attempts:
                    raise
                connection.reset(used)
                time.sleep(0.05 * (attempt + 1))
            except (paramiko.SSHException, OSError, EOFError) as error:
                connection.reset(used)
                if attempt + 1 == attempts:
                    raise _translate(error) from error
        raise AssertionError("unreachable")

    def run(
        self,
        script: str,
        *,
        action: str,
        stdin: bytes = b"",
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        args: Sequence[str] = (),
        control: bool = False,
    ) -> Completed:
        """As [`Transport.run`]; a `control` script runs as the login user whatever
        `run_as` says.

        Raises:
            CommandError: as [`Transport.run`], and when sudo cannot run scripts as
                `run_as` (the error names the sudoers line it needs).
        """
        check_size(script, args, action)
        script, args = self._as(script, args, control)
        command = sh_command(script, args)

        def on_shell(connection: SshConnection) -> Completed:
            with connection.shell(timeout_s) as shell:
                try:
                    return shell.run(script, timeout_s, args)
                except TimeoutError as error:
                    if connection.is_open:
                        raise ScriptTimeout(action, timeout_s) from error
                    raise _translate(error) from error

        try:
            if stdin or action == "spawn":
                # A launcher gets a channel of its own: its stdin carries the secrets,
                # and nothing of the job can ever touch a shared shell.
                return self._attempt(action, lambda c: self._exec(c, command, stdin, timeout_s))
            return self._attempt(action, on_shell)
        except ScriptTimeout as error:
            raise timed_out(self.on_timeout, action, timeout_s) from error

    def run_to_end(
        self,
        script: str,
        *,
        action: str,
        pgid: int | None = None,
        timeout_s: float | None = None,
        args: Sequence[str] = (),
    ) -> Completed:
        # The remote script runs to its end whatever happens here: an interrupt of
        # this process does not stop it, a retry after a broken connection runs the
        # idempotent script again, and past `timeout_s` its shell is closed, the
        # script left to end by itself there.
        return self.run(script, action=action, timeout_s=timeout_s, args=args)

    def _exec(
        self, connection: SshConnection, command: str, stdin: bytes, timeout_s: float | None
    ) -> Completed:
        channel = connection.exec_channel()
        try:
            channel.exec_command(command)
            channel.sendall(stdin)
            channel.shutdown_write()
            return _drain(channel, timeout_s)
        finally:
            channel.close()

    def send(
        self,
        script: str,
        *,
        action: str,
        source: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
        check_size(script, args, action)
        script, args = self._as(script, args, False)

        def call(connection: SshConnection) -> Completed:
            channel = connection.exec_channel()
            try:
                channel.exec_command(sh_command(script, args))
                writer = _ChannelWriter(channel)
                source(writer)  # type: ignore[arg-type]
                channel.shutdown_write()
                return _drain(channel, None)
            finally:
                channel.close()

        return self._attempt(action, call)

    def receive(
        self,
        script: str,
        *,
        action: str,
        sink: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
        check_size(script, args, action)
        script, args = self._as(script, args, False)

        def call(connection: SshConnection) -> Completed:
            channel = connection.exec_channel()
            try:
                channel.exec_command(sh_command(script, args))
                channel.shutdown_write()
                errors = _StderrDrain(channel)
                reader = _ChannelReader(channel)
                sink(reader)  # type: ignore[arg-type]
                while reader.read(CHUNK):
                    pass
                errors.join()
                return Completed(_exit_status(channel), b"", errors.data)
            finally:
                channel.close()

        return self._attempt(action, call)

    def _as(self, script: str, args: Sequence[str], control: bool) -> tuple[str, Sequence[str]]:
        """`script` and `args` as they run: as the jobs' user (`sudo -n -u USER -- env -i
        ... sh -c SCRIPT rw ARG...`, behind [`_EXEC_ARGS`]) when there is a `run_as`
        and the script is not `control`, else unchanged."""
        if self.run_as is None or control:
            return script, args
        words = [*self._user_words(), "sh", "-c", script, SCRIPT_NAME, *args]
        cgroup = getattr(self._entering, "cgroup", None)
        if cgroup is not None:
            return sh("ssh_cgroup_enter"), [cgroup, self.run_as, *words]
        return _EXEC_ARGS, words

    @contextlib.contextmanager
    def entering(self, cgroup: str) -> Iterator[None]:
        """Within it, a script this thread runs as `run_as` first enters the cgroup
        `cgroup` as the login user (`sh/ssh_cgroup_enter.sh`: made, its `cgroup.procs`
        and `cgroup.kill` given to the user: `chown`ed by a root login, by one that is
        not root `chgrp`ed to the user's primary group and made group-writable), and
        only then changes to the user, so everything it starts is born in the cgroup
        and none can leave."""
        self._entering.cgroup = cgroup
        try:
            yield
        finally:
            self._entering.cgroup = None

    def _user_words(self) -> list[str]:
        """The words in front of `sh` of a script run as `run_as`, once checked."""
        with self._ready_lock:
            if self._as_user is None:
                self._as_user = self._check_user()
            return self._as_user

    def _check_user(self) -> list[str]:
        user = self.run_as
        assert user is not None
        result = self.run(
            sh("ssh_runas"), action="run as", args=(user,), control=True,
            timeout_s=_READY_TIMEOUT_S,
        )  # fmt: skip
        text = result.stdout.decode("utf-8", "replace").rstrip("\n")
        uid, _, home = text.partition(" ")
        if result.exit_code != 0 or not uid.isdigit() or not home.startswith("/"):
            why = error_line(result.stderr, result.exit_code) if result.exit_code else repr(text)
            if result.exit_code == 4:  # sudo refused: say what it needs
                why += (
                    f"; the login user runs the jobs as {user} through `sudo -n`: it needs the "
                    f"sudoers line `{self.destination.user} ALL=({user}) NOPASSWD: ALL` on "
                    "the target (docs/security.md, Running jobs as another user)"
                )
            raise CommandError(f"run as {user}", why)
        env = user_environment(user, home)
        return ["sudo", "-n", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]

    def reap(self, pgid: int) -> None:
        """Nothing to reap here: remote processes belong to the remote host."""

    def close(self) -> None:
        """Closes this destination's pooled connection (other executors of the same
        destination re-open it lazily)."""
        self.connection.close()


class _ChannelReader:
    """A minimal readable file over a channel, for `tarfile`. Each refill takes all
    paramiko has buffered: a smaller recv makes paramiko's buffer shift the rest (up
    to the 16 MiB window) on every call, and `channel.makefile` re-slices its own
    buffer on every read; both turn quadratic once the reader lags (measured: 0.7-0.9x
    OpenSSH's download rate before, 1.3x after)."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel
        self._data = memoryview(b"")

    def read(self, size: int = -1) -> bytes:
        if not self._data:
            chunk = self._channel.recv(WINDOW_SIZE)
            if not chunk:
                return b""
            self._data = memoryview(chunk)
        if size < 0:
            size = len(self._data)
        out, self._data = self._data[:size], self._data[size:]
        return bytes(out)


class _ChannelWriter:
    """A minimal writable file over a channel, for `tarfile`."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def write(self, data: bytes) -> int:
        # A memoryview: sendall slices what is left after every packet.
        self._channel.sendall(memoryview(data))  # type: ignore[arg-type] # accepts buffers
        return len(data)

    def flush(self) -> None:
        """Nothing buffered here."""


class _StderrDrain:
    def __init__(self, channel: paramiko.Channel) -> None:
        self.data = b""
        self._channel = channel
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        chunks = []
        while True:
            chunk = self._channel.recv_stderr(CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
        self.data = b"".join(chunks)

    def join(self) -> None:
        self._thread.join()


def _exit_status(channel: paramiko.Channel, timeout_s: float = 30.0) -> int:
    """The exit status of a command whose output has ended, waited for at most
    `timeout_s` seconds (a server that never sends it is a broken connection)."""
    if not channel.status_event.wait(timeout_s):
        raise SshError("disconnected", "the server never sent the command's exit status")
    if channel.recv_exit_status() < 0 and not channel.eof_received:
        # Closed with neither an exit status nor the end of its output: the connection
        # broke (a command killed by a signal still ends its output first).
        raise SshError("disconnected", "the connection broke before the command ended")
    return channel.recv_exit_status()


def _drain(channel: paramiko.Channel, timeout_s: float | None) -> Completed:
    """Reads stdout and stderr together until the command exits and both end, within
    `timeout_s` seconds (never an unbounded wait for the exit status)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    out: list[bytes] = []
    err: list[bytes] = []
    channel.setblocking(False)
    while True:
        progressed = False
        while channel.recv_ready():
            out.append(channel.recv(CHUNK))
            progressed = True
        while channel.recv_stderr_ready():
            err.append(channel.recv_stderr(CHUNK))
            progressed = True
        idle = not channel.recv_ready() and not channel.recv_stderr_ready()
        if idle and channel.exit_status_ready() and (channel.eof_received or channel.closed):
            break
        if deadline is not None and time.monotonic() > deadline:
            raise ScriptTimeout("run", timeout_s)
        if channel.closed and not channel.recv_ready() and not channel.recv_stderr_ready():
            if not channel.exit_status_ready():
                raise SshError("disconnected", "the channel closed before the command ended")
            break
        if not progressed:
            time.sleep(0.001)
    return Completed(channel.recv_exit_status(), b"".join(out), b"".join(err))
