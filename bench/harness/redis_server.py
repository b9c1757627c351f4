"""A real `redis-server` for the tests: private, on a unix socket, durable (AOF).

[`RedisServer`] runs `redis-server` with no TCP port, a unix socket, its data in a
directory of its own, AOF on with an fsync per write (`--appendonly yes
--appendfsync always`) and RDB snapshots off. So:

- `restart()` (SIGTERM, then start again on the same directory and socket) keeps
  every acknowledged write: it is read back from the AOF.
- `kill()` (SIGKILL) loses nothing acknowledged either (fsync per write); `start()`
  brings the server back.
- `stop()` ends it for good (SIGTERM, then SIGKILL after a grace period).

The server dies with the thread that started it (`PR_SET_PDEATHSIG` on Linux), so a
test run that is killed leaves no server behind. Plain code, no pytest:
[`running_redis`] is a context manager; the test modules wire it into fixtures.

Unix socket paths are limited to about 107 bytes, so the socket lives in a short
private directory under the system temp dir when the data directory's path is long.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["RedisServer", "client_for", "running_redis"]

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
_MAX_SOCKET_PATH = 100


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent (thread) dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def client_for(
    socket_path: Path | str,
    *,
    socket_timeout: float = 5.0,
    retries: int = 1,
    **kwargs: Any,
) -> redis.Redis:
    """A client of the server at `socket_path`: bytes replies, `socket_timeout`
    seconds per command, and `retries` immediate retries (no backoff) on a connection
    error, so a pooled connection that a restart broke is replaced at once, and a
    server that is down fails fast."""
    return redis.Redis(
        unix_socket_path=str(socket_path),
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), retries),
        **kwargs,
    )


class RedisServer:
    """One private `redis-server` process (see the module docstring)."""

    def __init__(
        self, data_dir: Path | str, binary: str = REDIS_SERVER, *, acl_file: bool = False
    ) -> None:
        """`acl_file`: the server keeps its users in `users.acl` in `data_dir` (`ACL
        SAVE` writes them there), so a restart keeps the users a test made."""
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.binary = binary
        self.acl_path: Path | None = None
        if acl_file:
            self.acl_path = self.data_dir / "users.acl"
            self.acl_path.touch()
        self._socket_dir: Path | None = None
        socket_path = self.data_dir / "redis.sock"
        if len(str(socket_path)) > _MAX_SOCKET_PATH:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="rw-redis-"))
            socket_path = self._socket_dir / "redis.sock"
        self.socket_path = socket_path
        self.log_path = self.data_dir / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`unix://` URL of the server, for Celery and redis-py's `from_url`."""
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def argv(self) -> list[str]:
        return [
            self.binary,
            "--port", "0",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
            *(["--aclfile", str(self.acl_path)] if self.acl_path is not None else []),
        ]  # fmt: skip

    def start(self, timeout_s: float = 10.0) -> None:
        """Starts the server (on the same directory and socket as before, if it ran)
        and returns once it answers PING. Raises `RuntimeError` (with the log's tail)
        when it exits or does not answer within `timeout_s` seconds."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("redis-server is already running")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
        )
        deadline = time.monotonic() + timeout_s
        probe = self.client(socket_timeout=1.0, retries=0)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self.process.returncode}: {self.log_tail()}"
                    )
                with contextlib.suppress(redis.RedisError):
                    if probe.ping():
                        return
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"redis-server did not answer within {timeout_s} s: {self.log_tail()}"
                    )
                time.sleep(0.01)
        finally:
            probe.close()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client of this server (see [`client_for`])."""
        return client_for(self.socket_path, **kwargs)

    def terminate(self, timeout_s: float = 10.0) -> None:
        """SIGTERM and wait: redis-server flushes its AOF and exits. SIGKILL when it is
        still there after `timeout_s` seconds. No-op when it is not running."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash. No-op when it is not running."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.kill()
        self.process.wait()

    def restart(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then start again on the same directory: data survives (AOF)."""
        self.terminate()
        self.start(timeout_s)

    def stop(self) -> None:
        """Ends the server for good and removes a private socket directory. The data
        directory is left to its owner."""
        self.terminate()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def log_tail(self, size: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def running_redis(data_dir: Path | str | None = None) -> Iterator[RedisServer]:
    """A started [`RedisServer`], stopped on exit. Without `data_dir`, a temporary
    directory is used and removed afterwards."""
    owned = data_dir is None
    path = Path(tempfile.mkdtemp(prefix="rw-redis-data-")) if data_dir is None else Path(data_dir)
    server = RedisServer(path)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if owned:
            shutil.rmtree(path, ignore_errors=True)
