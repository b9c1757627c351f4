"""One SSH connection per destination and process: every hop host-key checked strictly,
persistent remote shells for small commands, exec channels for the rest, and a pool
that a forked child never inherits."""

from __future__ import annotations

import contextlib
import os
import secrets as _secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final, NoReturn

import paramiko

from ..errors import CommandError, SshError
from ..scripts import quote
from ..scripts.common import sh
from ..transport import Completed
from .config import SshDestination

__all__ = [
    "CLIENT_REKEY_BYTES",
    "MAX_PACKET",
    "MAX_SHELLS",
    "WINDOW_SIZE",
    "SshConnection",
    "connection_pool",
]

WINDOW_SIZE: Final = 16 * 1024 * 1024
"""SSH channel window, in bytes: large enough that a transfer never waits for the
window on a fast link."""
MAX_PACKET: Final = 256 * 1024
"""Largest SSH packet we accept, in bytes: 8x OpenSSH's default, which more than
doubles paramiko's receive rate (fewer packets to decrypt and parse in Python)."""
PREFERRED_CIPHERS: Final = (
    # AES-GCM first: an AEAD cipher needs no separate HMAC pass, the costliest part of
    # paramiko's packet handling; the rest are paramiko's defaults, for old servers.
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)
MAX_SHELLS: Final = 4
"""Persistent shells per connection: concurrent small operations beyond this wait."""
CHUNK: Final = 1024 * 1024
"""Largest read from a channel at once, in bytes."""
CLIENT_REKEY_BYTES: Final = 1 << 37
"""Bytes either way after which this client starts a key re-exchange itself (paramiko's
default: 512 MiB). paramiko deadlocks for 30 s, then drops the connection, when the
server closes a channel while a re-exchange this client started is under way
(paramiko#822, open): its transport thread waits for itself to finish the exchange.
A server-started one is safe, and OpenSSH starts one on its own limit (RekeyLimit; by
default derived from the cipher: 64 GiB for AES), so this client leaves re-keying to
the server (128 GiB here only guards a server that never re-keys). Measured before:
4 of 9 downloads of 268 MB on one connection stalled 30 s, then failed and were
retried."""


def _connect_error(destination: SshDestination, error: BaseException) -> SshError:
    """Translates a paramiko or socket error raised while connecting."""
    where = str(destination)
    if isinstance(error, paramiko.BadHostKeyException):
        return SshError(
            "host_key",
            f"the host key of {where} CHANGED (known_hosts has another key): refusing to "
            "connect; if the server was reinstalled, replace its known_hosts entry",
        )
    if isinstance(error, paramiko.PasswordRequiredException):
        return SshError(
            "auth",
            f"the private key for {where} is encrypted and no SSH agent offers it: "
            "load it with ssh-add (runwarden never prompts)",
        )
    if isinstance(error, paramiko.AuthenticationException):
        return SshError("auth", f"{where} refused every key offered: {error}")
    if isinstance(error, paramiko.SSHException) and "not found in known_hosts" in str(error):
        return SshError(
            "host_key",
            f"the host key of {where} is unknown: add it to known_hosts "
            f"({destination.known_hosts_name}) after checking it; runwarden never adds one",
        )
    if isinstance(error, (TimeoutError, socket.timeout)):
        return SshError("connect", f"cannot reach {where}: timed out")
    if isinstance(error, (OSError, paramiko.SSHException, EOFError)):
        return SshError("connect", f"cannot connect to {where}: {error}")
    return SshError("connect", f"cannot connect to {where}: {error!r}")


class _RejectUnknown(paramiko.RejectPolicy):
    """paramiko's `RejectPolicy` (an unknown host is refused, never added), raising
    the wording our translation expects."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> NoReturn:
        raise paramiko.SSHException(f"{hostname} not found in known_hosts")


class _Shell:
    """A persistent remote `sh` reading commands from its standard input on one
    channel (`sh/ssh_shell.sh`, sent first, defines `rw_framed`). Each command runs in
    a subshell (so `exit`, a syntax error or a `cd` never reach the shell itself),
    its stdout passed through as bytes, its stderr captured, then two random markers
    frame stderr and the exit status."""

    def __init__(self, transport: paramiko.Transport, timeout_s: float) -> None:
        self.channel = transport.open_session(timeout=timeout_s)
        self.channel.exec_command("exec sh")
        self.channel.sendall(sh("ssh_shell").encode())

    def run(self, script: str, timeout_s: float | None, args: Sequence[str] = ()) -> Completed:
        token = _secrets.token_hex(16)
        head, tail = f"\x01rw-{token}-e\x01".encode(), f"\x01rw-{token}-x\x01".encode()
        # One command of quoted words: `rw_framed` gets the script and its arguments as
        # its own, as `sh -c SCRIPT rw ARG...` would.
        words = " ".join(quote(word) for word in (token, script, *args))
        self.channel.settimeout(timeout_s)
        self.channel.sendall(f"rw_framed {words}\n".encode())
        buffer = bytearray()
        searched = 0
        while True:
            chunk = self.channel.recv(CHUNK)
            if not chunk:
                raise SshError("terminated", "the remote shell ended")
            buffer += chunk
            end = buffer.find(tail, max(0, searched - len(tail)))
            searched = len(buffer)
            if end >= 0:
                newline = buffer.find(b"\n", end)
                if newline >= 0:
                    break
        start = buffer.rfind(head, 0, end)
        if start < 0:
            raise SshError("terminated", "the remote shell answered out of frame")
        try:
            code = int(buffer[end + len(tail) : newline].strip())
        except ValueError as error:
            raise SshError("terminated", "the remote shell answered out of frame") from error
        if len(buffer) > newline + 1:
            raise SshError("terminated", "the remote shell answered more than asked")
        return Completed(code, bytes(buffer[:start]), bytes(buffer[start + len(head) : end]))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()


_PROXY_REAP_S: Final = 5.0
"""How long closing a connection waits for its ProxyCommand to end after SIGTERM
before it is killed, in seconds."""


class _Proxy(paramiko.ProxyCommand):
    """paramiko's ProxyCommand whose close, called by the transport's thread and by
    [`SshConnection.close`] alike, ends the command once (SIGTERM, SIGKILL after
    [`_PROXY_REAP_S`]) and reaps it: paramiko's own only signals it, again at each
    call, which leaves a zombie per connection in a long-lived worker, and would
    signal whatever process got the pid once it was reaped."""

    def __init__(self, command_line: str) -> None:
        super().__init__(command_line)
        self._ending = threading.Lock()

    def close(self) -> None:
        with self._ending:
            if self.process.returncode is not None:
                return
            with contextlib.suppress(OSError):
                self.process.terminate()
            try:
                self.process.wait(timeout=_PROXY_REAP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=_PROXY_REAP_S)


class SshConnection:
    """One SSH connection to `destination`, through its ProxyJump hops or its
    ProxyCommand (`config`, module docstring). The
    constructor only stores; [`open`] connects and is idempotent; operations open
    lazily; [`close`] releases everything (shells, channels, hops)."""

    def __init__(self, destination: SshDestination) -> None:
        self.destination = destination
        self._clients: list[paramiko.SSHClient] = []
        self._proxy: _Proxy | None = None
        self._transport: paramiko.Transport | None = None
        self._shells: list[_Shell] = []
        self._shell_count = 0
        self._generation = 0
        """Counts `close` calls: a shell opened before the last one is not counted or
        kept (another thread closed its connection while it was in use)."""
        self._lock = threading.Condition()
        # Re-entrant: `open` closes a dead connection. `close` takes it too, so that a
        # thread closing a failed connection never interleaves with another opening.
        self._opening = threading.RLock()

    @property
    def is_open(self) -> bool:
        transport = self._transport
        return transport is not None and transport.is_active()

    def reset(self, failed: paramiko.Transport | None) -> None:
        """Closes the connection after a call on the transport `failed` broke, unless
        another thread already replaced it: a concurrent call that fails on the same
        broken connection must not close the new one a retry opened meanwhile."""
        with self._opening:
            if failed is None or self._transport is failed or self._transport is None:
                self.close()

    def open(self) -> paramiko.Transport:
        """Connects (every hop host-key checked) unless already connected; returns the
        transport.

        Raises:
            SshError: `connect`, `host_key` or `auth`, naming the destination.
        """
        with self._opening:
            if self._transport is not None and self._transport.is_active():
                return self._transport
            self.close()
            sock: paramiko.Channel | paramiko.ProxyCommand | None = None
            try:
                route = self.destination.route
                for index, hop in enumerate(route):
                    if index == 0 and hop.proxy_command is not None:
                        # Ended with the connection ([`close`]).
                        sock = self._proxy = _Proxy(hop.proxy_command)
                    client = self._client(hop, sock)
                    self._clients.append(client)
                    transport = client.get_transport()
                    assert transport is not None
                    if index + 1 < len(route):
                        nxt = route[index + 1]
                        sock = transport.open_channel(
                            "direct-tcpip",
                            (nxt.host, nxt.port),
                            ("127.0.0.1", 0),
                            timeout=hop.connect_timeout_s,
                        )
            except SshError:
                self.close()
                raise
            except (paramiko.SSHException, OSError, EOFError) as error:
                self.close()
                raise _connect_error(self.destination, error) from error
            transport = self._clients[-1].get_transport()
            assert transport is not None
            transport.set_keepalive(max(1, int(self.destination.keepalive_s)))
            self._transport = transport
            return transport

    @staticmethod
    def _client(
        hop: SshDestination, sock: paramiko.Channel | paramiko.ProxyCommand | None
    ) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        for path in hop.known_hosts:
            if path.exists():
                try:
                    client.load_system_host_keys(str(path))
                except (OSError, paramiko.SSHException) as error:
                    raise SshError(
                        "host_key", f"cannot read known_hosts {path}: {error}"
                    ) from error
        client.set_missing_host_key_policy(_RejectUnknown())

        def factory(sock: socket.socket | paramiko.Channel, **options: Any) -> paramiko.Transport:
            transport = paramiko.Transport(
                sock,
                default_window_size=WINDOW_SIZE,
                default_max_packet_size=MAX_PACKET,
                **options,
            )
            transport.packetizer.REKEY_BYTES = CLIENT_REKEY_BYTES
            supported = set(transport.get_security_options().ciphers)
            transport.get_security_options().ciphers = tuple(
                c for c in PREFERRED_CIPHERS if c in supported
            )
            transport.use_compression(False)
            return transport

        try:
            client.connect(
                hop.host,
                port=hop.port,
                username=hop.user,
                # paramiko takes a list too; its stubs say str only.
                key_filename=[str(p) for p in hop.identity_files] or None,  # type: ignore[arg-type]
                look_for_keys=not hop.identity_files,
                allow_agent=True,
                timeout=hop.connect_timeout_s,
                banner_timeout=hop.connect_timeout_s,
                auth_timeout=hop.connect_timeout_s,
                channel_timeout=hop.connect_timeout_s,
                sock=sock,
                transport_factory=factory,  # type: ignore[arg-type]
                passphrase=None,
            )
        except (paramiko.SSHException, OSError, EOFError) as error:
            client.close()
            raise _connect_error(hop, error) from error
        return client

    @contextlib.contextmanager
    def shell(self, timeout_s: float | None) -> Iterator[_Shell]:
        """A persistent shell for one command, from the idle ones or a new one (at
        most [`MAX_SHELLS`] at once; beyond, waits, at most `timeout_s` seconds: the
        command's own deadline). A shell whose command failed is closed, never
        reused.

        Raises:
            CommandError: no shell came free within `timeout_s`.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while not self._shells and self._shell_count >= MAX_SHELLS:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise CommandError("run", f"no free shell within {timeout_s:g} s")
                self._lock.wait(left)
            if self._shells:
                shell = self._shells.pop()
            else:
                self._shell_count += 1
                shell = None
            generation = self._generation
        try:
            if shell is None:
                shell = _Shell(self.open(), self.destination.connect_timeout_s)
            yield shell
        except BaseException:
            if shell is not None:
                shell.close()
            with self._lock:
                if generation == self._generation:
                    self._shell_count -= 1
                self._lock.notify()
            raise
        with self._lock:
            current = generation == self._generation
            if current:
                self._shells.append(shell)
            self._lock.notify()
        if not current:
            shell.close()  # its connection was closed meanwhile: neither counted nor kept

    def exec_channel(self) -> paramiko.Channel:
        """A new session channel on this connection, with the large window."""
        transport = self.open()
        try:
            return transport.open_session(
                window_size=WINDOW_SIZE,
                max_packet_size=MAX_PACKET,
                timeout=self.destination.connect_timeout_s,
            )
        except (paramiko.SSHException, OSError, EOFError) as error:
            raise SshError("disconnected", f"cannot open a channel: {error}") from error

    def disown(self) -> None:
        """In a forked child: the inherited connection belongs to the parent. Marks
        every channel closed and every transport inactive, writing nothing: a single
        packet from the child (paramiko's `Channel.__del__` sends a close) would
        advance the shared cipher state and break the parent's connection."""
        for client in self._clients:
            # paramiko has no public way to go quiet without writing a packet.
            transport: Any = client.get_transport()
            if transport is None:
                continue
            transport.active = False
            for channel in transport._channels.values():
                channel.closed = True
                channel.active = False
        self._clients = []
        self._shells = []
        self._transport = None

    def close(self) -> None:
        """Closes shells, the connection and its hops; idempotent. Safe while other
        threads use the connection: their calls fail as on a broken connection."""
        with self._opening:
            with self._lock:
                shells, self._shells = self._shells, []
                self._shell_count = 0
                self._generation += 1
                self._lock.notify_all()
            for shell in shells:
                shell.close()
            for client in reversed(self._clients):
                with contextlib.suppress(Exception):
                    client.close()
            self._clients = []
            self._transport = None
            proxy, self._proxy = self._proxy, None
            if proxy is not None:
                proxy.close()


class _Pool:
    """Connections by destination, for this process only: after a fork the child
    starts empty (it must never use its parent's transport, whose thread did not
    survive the fork) and leaves the parent's sockets alone."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._connections: dict[SshDestination, SshConnection] = {}
        self._lock = threading.Lock()

    def get(self, destination: SshDestination) -> SshConnection:
        with self._lock:
            if self._pid != os.getpid():
                self._forget()
            connection = self._connections.get(destination)
            if connection is None:
                connection = SshConnection(destination)
                self._connections[destination] = connection
            return connection

    def _forget(self) -> None:
        # Inherited connections are disowned, never closed, and stay referenced for
        # the life of the child, so no finalizer of theirs ever runs here.
        for connection in self._connections.values():
            connection.disown()
        _INHERITED.extend(self._connections.values())
        self._pid = os.getpid()
        self._connections = {}
        self._lock = threading.Lock()

    def close_all(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()


_INHERITED: list[SshConnection] = []
_POOL = _Pool()
os.register_at_fork(after_in_child=_POOL._forget)


def connection_pool() -> _Pool:
    """The connection pool of this process."""
    return _POOL
