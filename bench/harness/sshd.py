"""Real OpenSSH `sshd` servers for the SSH tests: generated host and client keys, a
free loopback port, key authentication only, strict known_hosts, and ProxyJump
chains whose inner servers are reachable only through the hop before them.

Plain functions and context managers; `conftest.py` wires them into fixtures:

- [`start_sshd`] / [`running_sshd`]: one server on loopback (`127.0.0.1`, a free
  port). Its [`SshServer`] carries everything a client needs: the client key, a
  known_hosts file (plain and hashed), an `ssh_config` with a `Host` alias.
- [`start_jump_chain`] / [`running_jump_chain`] / [`start_jump_pair`] /
  [`running_jump_pair`]: servers in network namespaces of their own (see "ProxyJump
  topology" below).
- [`write_known_hosts`] (optionally hashed with `ssh-keygen -H`),
  [`write_wrong_known_hosts`] (same `host:port`, another key), [`write_ssh_config`],
  [`make_key`].

Process tree and reaping. Each server runs as

    python -m workers.reaper -- [ip netns exec NS] python -I bench/harness/sshd.py --supervise ...
                                                     `-- sshd -D -e -f sshd_config

The reaper is a child subreaper that reaps every orphan (this machine's init does
not, and a zombie counts as a live process-group member for cancel). Jobs started
over SSH are re-parented to it when their launcher ends. The supervisor between the
reaper and `sshd` is what lets [`SshServer.kill`] + [`SshServer.start`] restart
`sshd` on the same port *under the same reaper*: jobs that outlive a killed `sshd`
(as they outlive a dropped connection) are still reaped. The supervisor takes
commands on its stdin (`start`, `probe`, `exit`); when its stdin closes (the test
process died) it kills everything under the reaper and exits, and so does the reaper.

- `kill()` SIGKILLs every `sshd` process of the server: the listener and the
  per-connection children (each in a session of its own, found by walking the
  ppid links under the reaper; any executable named `sshd*`, so the `sshd-session`
  of OpenSSH >= 9.8 too). Live connections drop at once. Processes that sessions
  started (commands, detached jobs) are left running, as a real `sshd` crash would.
- `start()` starts `sshd` again on the same port with the same host key.
- `stop()` kills everything under the reaper (leftover jobs included), then ends
  the supervisor and the reaper, and removes the server's delegated cgroup.

Delegation (`delegate=True`, for a `login` that is not root): the listening sshd is
moved into a cgroup of its own given to the login user ([`make_delegated_cgroup`]:
the directory and its `cgroup.procs`, `cgroup.subtree_control`, `cgroup.threads`, as
systemd's `Delegate=yes`), so every session, born there, finds its own cgroup
delegated to it, as a login in a delegated unit does. `stop()` kills what is left in
it and removes it ([`remove_cgroup_tree`]); a test process that died leaves it to the
next one made on the machine.

ProxyJump topology. "Reachable only through the previous hop" is made true by the
kernel, not by sshd access rules: the servers of a chain of length N live in N
network namespaces created for the test, linked in a line by veth pairs:

    root ns --veth-- ns0 (hop 0, sshd) --veth-- ns1 (hop 1, sshd) --veth-- ns2 ...

Each chain gets a /27 block of 10.213.0.0/16 (addresses of our own test hosts, on
this machine only): link k is the /30 at `base + 4k`, with `base + 4k + 1` on the
upstream side and `base + 4k + 2` in namespace k, where hop k's `sshd` listens.
The root namespace gets an `unreachable` route for the whole /27 (its connected
/30 to hop 0 is more specific), so a direct connection to hop 1+ fails at once
with EHOSTUNREACH and never follows the default route off the machine. Namespace
k has routes only to its two links and no forwarding, so hop k+1 is reached only
by an `sshd` in namespace k opening a `direct-tcpip` channel (which is what
ProxyJump does). An `sshd_config` rule on a shared loopback address would prove
much less: every local process could still reach the port, and a client that
skipped the jump would only be refused after connecting.

Teardown ([`NetnsChain.destroy`], called by `stop_jump_chain` and the context
managers) stops the servers, deletes the namespaces, the root-side veth and the
route. Leftovers of a test process that died are removed by the next chain set up
on the machine (namespaces are named `rwt-<owner pid>-<index>-<hop>`).

Needs: `openssh-server`, `openssh-client` (`sshd`, `ssh`, `ssh-keygen`), and for
chains `iproute2` (`ip`) and root (`CAP_NET_ADMIN`, `CAP_SYS_ADMIN`).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import pwd
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "LOOPBACK",
    "NetnsChain",
    "SshServer",
    "SshdError",
    "host_pattern",
    "make_delegated_cgroup",
    "make_key",
    "public_key",
    "remove_cgroup_tree",
    "running_jump_chain",
    "running_jump_pair",
    "running_sshd",
    "start_jump_chain",
    "start_jump_pair",
    "start_sshd",
    "stop_jump_chain",
    "write_known_hosts",
    "write_ssh_config",
    "write_wrong_known_hosts",
]

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 10.0
"""How long a server may take to accept TCP and send its SSH banner."""
STOP_TIMEOUT_S = 10.0
CHAIN_NET = ipaddress.IPv4Network("10.213.0.0/16")
CHAIN_BLOCK = 32
"""Addresses per chain: eight /30 links, so a chain has at most 8 hops."""
_NETNS_RE = re.compile(r"^rwt-(\d+)-(\d+)-(\d+)$")


class SshdError(RuntimeError):
    """A server could not be configured, started or stopped; the message holds the
    reason (sshd's own words when it has any)."""


class _SshdExited(SshdError):
    """sshd ended while starting (such as a port taken between choice and bind)."""


def _sbin(name: str) -> str:
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    found = shutil.which(name, path=path)
    if found is None:
        raise SshdError(f"`{name}` is not installed")
    return found


# --- processes ---------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state) of `pid`, None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), fields[0]


def _alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[1] not in ("Z", "X")


def _exists(pid: int) -> bool:
    """Whether `pid` exists at all (a zombie not yet reaped exists)."""
    return _stat(pid) is not None


def _descendants(root: int) -> list[int]:
    """Every process under `root` (zombies included), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
    found: list[int] = []
    queue = [root]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def _is_sshd(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("sshd")
    except OSError:
        return False


def _sigkill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _kill_under(root: int, *, keep: Sequence[int] = (), only_sshd: bool = False) -> None:
    """SIGKILLs the processes under `root` (all, or only sshd's) except `keep`, until
    none is left, zombies reaped too (our reaper reaps them)."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while True:
        under = [p for p in _descendants(root) if p not in keep]
        if only_sshd:
            under = [p for p in under if _is_sshd(p)]
        if not under:
            return
        _sigkill([p for p in under if _alive(p)])
        if time.monotonic() > deadline:
            raise SshdError(f"processes under {root} survive SIGKILL: {under}")
        time.sleep(0.005)


# --- the supervisor (runs as `python bench/harness/sshd.py --supervise LOG -- SSHD...`) -----


def _banner(host: str, port: int, timeout_s: float) -> str | None:
    """Connects to `host:port` and reads an SSH banner; None on success, else why
    not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            data = b""
            while b"\n" not in data and len(data) < 1024:
                chunk = sock.recv(1024)
                if not chunk:
                    break
                data += chunk
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    if not data.startswith(b"SSH-2.0-"):
        return f"no SSH banner: {data[:80]!r}"
    return None


def _supervise(log: str, sshd_argv: list[str]) -> int:
    """Starts sshd on `start` (replies `pid N`), probes on `probe HOST PORT TIMEOUT`
    (replies `ok` or `err WHY`), exits on `exit` or EOF, then kills everything under
    its parent (the reaper) but itself."""
    reaper = os.getppid()
    sshds: list[subprocess.Popen[bytes]] = []
    print(f"ready {os.getpid()}", flush=True)
    while True:
        line = sys.stdin.readline()
        words = line.split()
        if not words or words[0] == "exit":
            break
        if words[0] == "start":
            with open(log, "ab") as out:
                proc = subprocess.Popen(sshd_argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            threading.Thread(target=proc.wait, daemon=True).start()
            sshds.append(proc)
            print(f"pid {proc.pid}", flush=True)
        elif words[0] == "probe" and len(words) == 4:
            why = _banner(words[1], int(words[2]), float(words[3]))
            print("ok" if why is None else f"err {why}", flush=True)
        else:
            print(f"err unknown command {line!r}", flush=True)
    with contextlib.suppress(SshdError):
        _kill_under(reaper, keep=[os.getpid()])
    return 0


# --- keys, known_hosts, ssh_config -------------------------------------------------


def make_key(path: Path, *, passphrase: str = "", comment: str = "runwarden-test") -> Path:
    """Generates an ed25519 key pair at `path` and `path.pub` (mode 0600), encrypted
    when `passphrase` is given. `path` must not exist yet."""
    if path.exists():
        raise SshdError(f"{path} exists already")
    done = subprocess.run(
        [
            _sbin("ssh-keygen"),
            "-t",
            "ed25519",
            "-q",
            "-N",
            passphrase,
            "-C",
            comment,
            "-f",
            str(path),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SshdError(f"ssh-keygen failed for {path}: {done.stderr.strip()}")
    path.chmod(0o600)
    return path


def public_key(private_key: Path) -> str:
    """The `type base64` public key line of `private_key` (from its `.pub`), with
    no comment."""
    words = Path(f"{private_key}.pub").read_text(encoding="ascii").split()
    return f"{words[0]} {words[1]}"


def host_pattern(host: str, port: int) -> str:
    """The known_hosts host field OpenSSH and paramiko look up: `host` on port 22,
    else `[host]:port`."""
    return host if port == 22 else f"[{host}]:{port}"


def write_known_hosts(path: Path, *servers: SshServer, hashed: bool = False) -> Path:
    """Writes a known_hosts file with the host key of each of `servers`, host names
    hashed (`ssh-keygen -H`, `|1|salt|hash` entries, no plain name left) when
    `hashed`."""
    path.write_text(
        "".join(f"{host_pattern(s.host, s.port)} {s.host_key_pub}\n" for s in servers),
        encoding="ascii",
    )
    if hashed:
        done = subprocess.run(
            [_sbin("ssh-keygen"), "-H", "-f", str(path)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        Path(f"{path}.old").unlink(missing_ok=True)
        if done.returncode != 0:
            raise SshdError(f"ssh-keygen -H failed: {done.stderr.strip()}")
    return path


def write_wrong_known_hosts(path: Path, server: SshServer, *, hashed: bool = False) -> Path:
    """Writes a known_hosts file that names `server`'s host and port with another
    ed25519 key (a changed host key, as after a reinstall or an attack)."""
    other = make_key(path.with_name(f"{path.name}.other_host_key"))
    line = f"{host_pattern(server.host, server.port)} {public_key(other)}\n"
    path.write_text(line, encoding="ascii")
    if hashed:
        subprocess.run(
            [_sbin("ssh-keygen"), "-H", "-f", str(path)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
        )
        Path(f"{path}.old").unlink(missing_ok=True)
    return path


def write_ssh_config(
    path: Path,
    *servers: SshServer,
    known_hosts: Path | None = None,
    identity: Path | None = None,
    extra: str = "",
) -> Path:
    """Writes an ssh_config with one `Host <alias>` block per server (HostName, Port,
    User, IdentityFile, UserKnownHostsFile, StrictHostKeyChecking yes,
    IdentitiesOnly yes, BatchMode yes). A server with a `jump` gets `ProxyJump
    <jump's alias>` (so a chain resolves hop by hop) and a second block
    `<alias>-direct` without it. `known_hosts` / `identity` replace each server's
    own; `extra` lines go into every block."""
    blocks: list[str] = []
    for server in servers:
        proxies = [(server.alias, server.jump)]
        if server.jump is not None:
            proxies.append((f"{server.alias}-direct", None))
        for alias, jump in proxies:
            lines = [
                f"Host {alias}",
                f"  HostName {server.host}",
                f"  Port {server.port}",
                f"  User {server.user}",
                f"  IdentityFile {identity or server.client_key}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {known_hosts or server.known_hosts}",
                "  GlobalKnownHostsFile /dev/null",
                "  StrictHostKeyChecking yes",
                "  UpdateHostKeys no",
                "  BatchMode yes",
                "  ConnectTimeout 5",
            ]
            if jump is not None:
                lines.append(f"  ProxyJump {jump.alias}")
            lines.extend(f"  {x.strip()}" for x in extra.splitlines() if x.strip())
            blocks.append("\n".join(lines) + "\n")
    path.write_text("\n".join(blocks), encoding="utf-8")
    return path


# --- the server --------------------------------------------------------------------


@dataclass(eq=False)
class SshServer:
    """One running (or stopped) OpenSSH server and what a client needs to reach it."""

    host: str
    port: int
    user: str
    client_key: Path
    """Unencrypted ed25519 private key (mode 0600) in the server's authorized_keys."""
    known_hosts: Path
    """This server's host key, `[host]:port ssh-ed25519 ...` (`host` alone on 22)."""
    known_hosts_hashed: Path
    """The same entry, hashed (`|1|salt|hash ssh-ed25519 ...`)."""
    host_key: Path
    host_key_pub: str
    """`ssh-ed25519 AAAA...`"""
    workdir: Path
    """An empty directory for run directories (same filesystem for every server)."""
    ssh_config: Path
    """`Host <alias>` for this server (a chain's file holds every hop)."""
    alias: str
    sshd_config: Path
    log: Path
    """sshd's log (LogLevel VERBOSE) and the supervisor's."""
    netns: str | None = None
    """The network namespace the server lives in (chains), None for loopback."""
    jump: SshServer | None = None
    """The hop a client must go through (chains), None when reachable directly."""
    chain: NetnsChain | None = field(default=None, repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    """The reaper (root of this server's process tree) while running."""
    sshd_pid: int | None = None
    """The listening sshd while running."""
    delegate: bool = False
    """Whether the login's sessions run in a cgroup delegated to it ([`cgroup`])."""
    cgroup: Path | None = None
    """With `delegate`, while the server exists: the cgroup v2 directory its listening
    sshd runs in, so every session is born there, given to the login user as systemd's
    `Delegate=yes` gives a unit's: the directory and its `cgroup.procs`,
    `cgroup.subtree_control` and `cgroup.threads` (made at the first `start()`,
    removed by `stop()`)."""
    _supervisor_pid: int | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def is_running(self) -> bool:
        return self.sshd_pid is not None and _alive(self.sshd_pid)

    def ssh_argv(self, *command: str, options: Sequence[str] = ()) -> list[str]:
        """The argv of OpenSSH's `ssh` running `command` on this server through its
        `ssh_config` alias (so through its jumps), never prompting."""
        return [
            "ssh",
            "-F",
            str(self.ssh_config),
            "-o",
            "BatchMode=yes",
            *options,
            self.alias,
            *command,
        ]

    def start(self) -> None:
        """Starts sshd (again: same port, same host key, same reaper when it still
        runs) and waits until it sends its SSH banner; nothing when it runs."""
        if self.is_running:
            return
        if self.process is None or self.process.poll() is not None:
            self._spawn_reaper()
        offset = self.log.stat().st_size if self.log.exists() else 0
        reply = self._ask("start")
        if not reply.startswith("pid "):
            raise SshdError(f"the supervisor of {self.alias} answered {reply!r}")
        self.sshd_pid = int(reply.split()[1])
        if self.delegate:
            if self.cgroup is None:
                self.cgroup = make_delegated_cgroup(self.user)
            # Before it accepts a connection (it has not said it listens yet); one
            # that ended meanwhile is told below.
            with contextlib.suppress(ProcessLookupError):
                (self.cgroup / "cgroup.procs").write_text(f"{self.sshd_pid}\n")
        deadline = time.monotonic() + START_TIMEOUT_S
        why = "not listening yet"
        while True:
            # The port is ours once this sshd said so (else another server holding
            # it could answer the probe); then it must send its banner.
            listening = f"Server listening on {self.host} port {self.port}." in self._log_from(
                offset
            )
            if not _alive(self.sshd_pid):
                self.sshd_pid = None
                raise _SshdExited(f"sshd {self.alias} ended while starting:\n{self.log_text()}")
            if listening:
                why = self.probe(self.host, self.port, 1.0) or ""
                if not why:
                    return
            if time.monotonic() > deadline:
                raise SshdError(
                    f"sshd {self.alias} sent no banner on {self.host}:{self.port} within "
                    f"{START_TIMEOUT_S} s ({why}):\n{self.log_text()}"
                )
            time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILLs the listening sshd and every per-connection sshd: connections
        drop at once, new ones are refused. What sessions started keeps running
        (and is reaped by this server's reaper). `start()` brings it back."""
        if self.process is not None:
            _kill_under(self.process.pid, only_sshd=True)
        self.sshd_pid = None

    def stop(self) -> None:
        """Kills everything this server runs (sshd, sessions, leftover jobs), then
        its supervisor and reaper. `start()` starts it again."""
        process, self.process, self.sshd_pid = self.process, None, None
        try:
            self._stop(process)
        finally:
            if self.cgroup is not None:
                remove_cgroup_tree(self.cgroup)
                self.cgroup = None

    def _stop(self, process: subprocess.Popen[bytes] | None) -> None:
        if process is None:
            return
        if process.poll() is None:
            keep = [self._supervisor_pid] if self._supervisor_pid else []
            _kill_under(process.pid, keep=keep)
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.write(b"exit\n")
                    process.stdin.close()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill_under(process.pid)
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def probe(self, host: str, port: int, timeout_s: float = 2.0) -> str | None:
        """Connects to `host:port` from this server's network namespace and reads
        an SSH banner: None when it worked, else why not. Needs the server's
        supervisor (a server started at least once and not stopped)."""
        return self._ask(f"probe {host} {port} {timeout_s}", timeout_s + 5.0) or None

    def _log_from(self, offset: int) -> str:
        try:
            with open(self.log, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    # -- the supervisor -----------------------------------------------------------

    def _spawn_reaper(self) -> None:
        sshd_argv = [_sbin("sshd"), "-D", "-e", "-f", str(self.sshd_config)]
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        argv = [
            sys.executable,
            "-m",
            "workers.reaper",
            "--",
            *inside,
            sys.executable,
            "-I",
            str(Path(__file__).resolve()),
            "--supervise",
            str(self.log),
            "--",
            *sshd_argv,
        ]
        with open(self.log, "ab") as err:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                cwd=ROOT,
            )
        reply = self._read_line(START_TIMEOUT_S)
        if not reply.startswith("ready "):
            self.stop()
            raise SshdError(f"the supervisor of {self.alias} did not start:\n{self.log_text()}")
        self._supervisor_pid = int(reply.split()[1])

    def _ask(self, command: str, timeout_s: float = START_TIMEOUT_S) -> str:
        """Sends one command to the supervisor; its one-line answer ("" for ok)."""
        with self._lock:
            process = self.process
            if process is None or process.stdin is None or process.poll() is not None:
                raise SshdError(f"server {self.alias} is stopped")
            try:
                process.stdin.write(command.encode() + b"\n")
                process.stdin.flush()
            except OSError as error:
                raise SshdError(f"the supervisor of {self.alias} is gone: {error}") from error
            reply = self._read_line(timeout_s)
        if reply == "ok":
            return ""
        return reply.removeprefix("err ") if reply.startswith("err ") else reply

    def _read_line(self, timeout_s: float) -> str:
        assert self.process is not None
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        data = b""
        deadline = time.monotonic() + timeout_s
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SshdError(
                    f"the supervisor of {self.alias} did not answer:\n{self.log_text()}"
                )
            byte = os.read(fd, 1)
            if not byte:
                raise SshdError(f"the supervisor of {self.alias} ended:\n{self.log_text()}")
            data += byte
        return data.decode().strip()


DELEGATED_PREFIX = "rw-test-sshd-"
"""The test sshds' delegated cgroups: `<hierarchy>/rw-test-sshd-<owner pid>-<hex>`."""


def _cgroup_mount() -> Path:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2" and "rw" in fields[3].split(","):
            return Path(fields[1])
    raise SshdError("no writable cgroup v2 hierarchy: a delegated sshd needs one (and root)")


def _populated(path: Path) -> bool:
    try:
        return "populated 0" not in (path / "cgroup.events").read_text().splitlines()
    except FileNotFoundError:
        return False


def remove_cgroup_tree(path: Path, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Kills every process of the cgroup `path` and below (`cgroup.kill`), waits until
    it is empty, and removes it with every cgroup under it. Raises `SshdError` when
    something is left."""
    if not path.is_dir():
        return
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + timeout_s
    while _populated(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    for directory, _, _ in os.walk(path, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    if path.exists():
        raise SshdError(f"the cgroup {path} could not be removed (populated: {_populated(path)})")


def make_delegated_cgroup(user: str) -> Path:
    """A new cgroup under the hierarchy's root delegated to `user` (the directory and
    its `cgroup.procs`, `cgroup.subtree_control` and `cgroup.threads` `chown`ed to it, as
    systemd's `Delegate=yes` does); those a test process that died left are removed
    first."""
    mount = _cgroup_mount()
    for stale in mount.glob(f"{DELEGATED_PREFIX}*"):
        owner = stale.name.removeprefix(DELEGATED_PREFIX).split("-")[0]
        if owner.isdigit() and not _exists(int(owner)):
            with contextlib.suppress(SshdError, OSError):
                remove_cgroup_tree(stale)
    path = mount / f"{DELEGATED_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    entry = pwd.getpwnam(user)
    for item in (path, path / "cgroup.procs", path / "cgroup.subtree_control",
                 path / "cgroup.threads"):  # fmt: skip
        os.chown(item, entry.pw_uid, entry.pw_gid)
    return path


def _current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _check_account(user: str) -> None:
    """With `UsePAM no`, sshd refuses a locked account (password field `!...`) even
    for key authentication: say so instead of a bare `Permission denied`."""
    with contextlib.suppress(OSError), open("/etc/shadow", encoding="utf-8") as shadow:
        for line in shadow:
            name, _, rest = line.partition(":")
            if name == user and rest.startswith("!"):
                raise SshdError(
                    f"account {user!r} is locked (/etc/shadow password starts with '!'); "
                    f"sshd without PAM refuses it: unlock with `usermod -p '*' {user}`"
                )


def _ensure_privsep_dir() -> None:
    run_sshd = Path("/run/sshd")
    if not run_sshd.is_dir():
        run_sshd.mkdir(mode=0o755, parents=True, exist_ok=True)
        run_sshd.chmod(0o755)


@functools.cache
def _sshd_version() -> tuple[int, int]:
    done = subprocess.run([_sbin("sshd"), "-V"], capture_output=True, text=True, check=False)
    found = re.search(r"OpenSSH_(\d+)\.(\d+)", done.stdout + done.stderr)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _free_port(host: str) -> int:
    # This file also runs alone (the supervisor's script): `ports.free_port` cannot be
    # imported there.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _write_sshd_config(
    path: Path,
    *,
    port: int,
    listen: str,
    host_key: Path,
    authorized_keys: Path,
    user: str,
    extra: str,
) -> None:
    lines = [
        f"Port {port}",
        f"ListenAddress {listen}",
        f"HostKey {host_key}",
        f"PidFile {path.parent / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"AllowUsers {user}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        "AllowTcpForwarding yes",
        "X11Forwarding no",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "PermitUserEnvironment no",
        "Subsystem sftp internal-sftp",
        "LogLevel VERBOSE",
        "LoginGraceTime 30",
        "MaxSessions 100",
        "MaxStartups 100:30:200",
        # Bash sources ~/.bashrc when sshd starts it for a command at shell level 1;
        # level 2 skips it. The tests log in as whoever runs them, and that account's
        # dotfiles are the machine's, not the project's: this machine's root .bashrc
        # runs `pyenv rehash`, which waits 60 s on a lock a killed shell left behind,
        # and every command then outlives its test's timeout. Hence SHLVL=1 below.
    ]
    # sshd takes the first SetEnv line only: the extra configuration's variables join
    # this one.
    kept, variables = [], ["SHLVL=1"]
    for line in extra.splitlines():
        if line.strip().lower().startswith("setenv "):
            variables += line.split()[1:]
        else:
            kept.append(line)
    extra = "\n".join(kept)
    lines.append("SetEnv " + " ".join(variables))
    if _sshd_version() >= (9, 8):
        # Else failed authentications (the wrong-key tests) get 127.0.0.1 refused.
        lines.append("PerSourcePenalties no")
    path.write_text("\n".join(lines) + "\n" + extra + "\n", encoding="utf-8")
    done = subprocess.run(
        [_sbin("sshd"), "-t", "-f", str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SshdError(f"sshd rejects {path}: {done.stderr.strip()}")


def _new_server(
    directory: Path,
    *,
    alias: str,
    host: str,
    port: int,
    listen: str,
    host_key: Path | None,
    client_key: Path | None,
    extra_config: str,
    netns: str | None = None,
    jump: SshServer | None = None,
    login: str | None = None,
    delegate: bool = False,
) -> SshServer:
    """Keys, authorized_keys, sshd_config (checked by `sshd -t`), known_hosts and
    ssh_config of a server in `directory`; not started. `login`: the one user who may
    log in (default: the current user); another user's authorized_keys is given to it,
    and `directory` must be one it can reach."""
    directory.mkdir(parents=True, exist_ok=True)
    _ensure_privsep_dir()
    user = login or _current_user()
    _check_account(user)
    host_key = host_key or make_key(directory / "host_ed25519", comment=f"host-{alias}")
    client_key = client_key or make_key(directory / "client_ed25519", comment=f"client-{alias}")
    authorized_keys = directory / "authorized_keys"
    authorized_keys.write_text(public_key(client_key) + "\n", encoding="ascii")
    authorized_keys.chmod(0o600)
    if login is not None:
        entry = pwd.getpwnam(login)
        os.chown(authorized_keys, entry.pw_uid, entry.pw_gid)
    workdir = directory / "work"
    workdir.mkdir(exist_ok=True)
    sshd_config = directory / "sshd_config"
    _write_sshd_config(
        sshd_config,
        port=port,
        listen=listen,
        host_key=host_key,
        authorized_keys=authorized_keys,
        user=user,
        extra=extra_config,
    )
    server = SshServer(
        host=host,
        port=port,
        user=user,
        client_key=client_key,
        known_hosts=directory / "known_hosts",
        known_hosts_hashed=directory / "known_hosts.hashed",
        host_key=host_key,
        host_key_pub=public_key(host_key),
        workdir=workdir,
        ssh_config=directory / "ssh_config",
        alias=alias,
        sshd_config=sshd_config,
        log=directory / "sshd.log",
        netns=netns,
        jump=jump,
        delegate=delegate,
    )
    write_known_hosts(server.known_hosts, server)
    write_known_hosts(server.known_hosts_hashed, server, hashed=True)
    write_ssh_config(server.ssh_config, server)
    return server


def start_sshd(
    tmp: Path,
    *,
    name: str = "a",
    host_key: Path | None = None,
    client_key: Path | None = None,
    port: int | None = None,
    listen: str = LOOPBACK,
    extra_config: str = "",
    alias: str = "rw-target",
    login: str | None = None,
    delegate: bool = False,
) -> SshServer:
    """Starts an sshd on `listen` (loopback) in `tmp/sshd-<name>/`: host and client
    ed25519 keys generated unless given, a free port unless given, key
    authentication only for the current user (or `login`, for whom `tmp` must be
    reachable: a `users.shared_dir`), `extra_config` appended to the
    sshd_config (a `Match` block goes there); with `delegate`, every session runs in a
    cgroup delegated to the login user ([`SshServer.cgroup`]). Raises `SshdError` with sshd's words
    when the configuration is invalid or sshd does not come up within 10 s."""
    for attempt in range(5):
        server = _new_server(
            tmp / f"sshd-{name}",
            alias=alias,
            host=listen,
            port=port if port is not None else _free_port(listen),
            listen=listen,
            host_key=host_key,
            client_key=client_key,
            extra_config=extra_config,
            login=login,
            delegate=delegate,
        )
        host_key, client_key = server.host_key, server.client_key
        try:
            server.start()
        except _SshdExited:
            server.stop()
            if port is not None or attempt == 4:
                raise
            continue
        except BaseException:
            server.stop()
            raise
        return server
    raise AssertionError("unreachable")


@contextlib.contextmanager
def running_sshd(
    tmp: Path,
    *,
    name: str = "a",
    host_key: Path | None = None,
    client_key: Path | None = None,
    port: int | None = None,
    listen: str = LOOPBACK,
    extra_config: str = "",
    alias: str = "rw-target",
    login: str | None = None,
    delegate: bool = False,
) -> Iterator[SshServer]:
    """[`start_sshd`], stopped on exit."""
    server = start_sshd(
        tmp,
        name=name,
        host_key=host_key,
        client_key=client_key,
        port=port,
        listen=listen,
        extra_config=extra_config,
        alias=alias,
        login=login,
        delegate=delegate,
    )
    try:
        yield server
    finally:
        server.stop()


# --- ProxyJump chains in network namespaces ---------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([_sbin("ip"), *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise SshdError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(eq=False)
class NetnsChain:
    """The namespaces, veth pairs and route of one jump chain (see the module)."""

    index: int
    length: int
    namespaces: list[str] = field(default_factory=list)
    servers: list[SshServer] = field(default_factory=list)

    @property
    def block(self) -> ipaddress.IPv4Network:
        return block_of(self.index)

    def address(self, hop: int) -> str:
        """Where hop `hop`'s sshd listens."""
        return str(self.block.network_address + 4 * hop + 2)

    def upstream(self, hop: int) -> str:
        """The address hop `hop` sees connections from (root ns or hop - 1)."""
        return str(self.block.network_address + 4 * hop + 1)

    def destroy(self) -> None:
        """Stops the servers, deletes the namespaces, the root-side veth, the route."""
        for server in reversed(self.servers):
            with contextlib.suppress(SshdError):
                server.stop()
        _remove_chain(self.index, self.namespaces)


def block_of(index: int) -> ipaddress.IPv4Network:
    address = CHAIN_NET.network_address + index * CHAIN_BLOCK
    return ipaddress.IPv4Network(f"{address}/27")


def _remove_chain(index: int, namespaces: Sequence[str], *, link_and_route: bool = True) -> None:
    for ns in namespaces:
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        _sigkill([int(p) for p in pids if p.isdigit()])
        _ip("netns", "del", ns, check=False)
    if link_and_route:
        _ip("link", "del", f"rwt{index}h0", check=False)
        _ip("route", "del", "unreachable", str(block_of(index)), check=False)


def _remove_stale_chains() -> None:
    """Removes what chains of dead test processes left behind."""
    try:
        names = os.listdir("/run/netns")
    except FileNotFoundError:
        return
    owners: dict[int, set[int]] = {}
    stale: dict[int, list[str]] = {}
    for name in names:
        found = _NETNS_RE.match(name)
        if found:
            pid, index = int(found[1]), int(found[2])
            if _pid_alive(pid):
                owners.setdefault(index, set()).add(pid)
            else:
                stale.setdefault(index, []).append(name)
    for index, namespaces in stale.items():
        _remove_chain(index, namespaces, link_and_route=index not in owners)


def _claim_index() -> int:
    """Claims a chain index by creating its root-side veth pair (atomic: the name
    exists or not) and its unreachable route."""
    slots = CHAIN_NET.num_addresses // CHAIN_BLOCK
    start = (os.getpid() * 7919) % slots
    for step in range(slots):
        index = (start + step) % slots
        done = _ip(
            "link",
            "add",
            f"rwt{index}h0",
            "type",
            "veth",
            "peer",
            "name",
            f"rwt{index}n0",
            check=False,
        )
        if done.returncode == 0:
            _ip("route", "replace", "unreachable", str(block_of(index)))
            return index
        if "exists" not in done.stderr:
            raise SshdError(f"cannot create a veth pair: {done.stderr.strip()}")
    raise SshdError("no free chain index")


def _build_chain(length: int) -> NetnsChain:
    if not 1 <= length <= CHAIN_BLOCK // 4:
        raise SshdError(f"a chain has 1 to {CHAIN_BLOCK // 4} hops, not {length}")
    _remove_stale_chains()
    chain = NetnsChain(_claim_index(), length)
    index = chain.index
    try:
        for hop in range(length):
            ns = f"rwt-{os.getpid()}-{index}-{hop}"
            _ip("netns", "add", ns)
            chain.namespaces.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            up, down = f"rwt{index}h{hop}", f"rwt{index}n{hop}"
            if hop == 0:
                _ip("link", "set", down, "netns", ns)
                upstream: list[str] = []
            else:
                upstream = ["-n", chain.namespaces[hop - 1]]
                _ip(*upstream, "link", "add", up, "type", "veth", "peer", "name", down, "netns", ns)
            _ip(*upstream, "addr", "add", f"{chain.upstream(hop)}/30", "dev", up)
            _ip(*upstream, "link", "set", up, "up")
            _ip("-n", ns, "addr", "add", f"{chain.address(hop)}/30", "dev", down)
            _ip("-n", ns, "link", "set", down, "up")
    except BaseException:
        chain.destroy()
        raise
    return chain


def start_jump_chain(
    tmp: Path,
    length: int = 3,
    *,
    aliases: Sequence[str] | None = None,
    ports: Sequence[int] | None = None,
) -> list[SshServer]:
    """Starts `length` servers in a line of network namespaces: the first reachable
    from here, each next one only from the namespace of the one before (see the
    module). Every server uses the same client key; every server's `ssh_config` is
    one file with all hops (hop k > 0: `ProxyJump <alias of hop k-1>`, and
    `<alias>-direct` without), naming a known_hosts file with every hop's key
    (`tmp/jump-known_hosts`); each server's own `known_hosts` holds its key only.

    Ports default to 2222 for the first hop (a `[host]:port` known_hosts entry) and
    22 for the others (a plain `host` entry). Aliases default to `rw-hop<k>`.
    Undo with [`stop_jump_chain`] (or use [`running_jump_chain`])."""
    aliases = list(aliases or [f"rw-hop{k}" for k in range(length)])
    ports = list(ports or [2222] + [22] * (length - 1))
    chain = _build_chain(length)
    try:
        client_key: Path | None = None
        jump: SshServer | None = None
        for hop in range(length):
            server = _new_server(
                tmp / f"sshd-{aliases[hop]}",
                alias=aliases[hop],
                host=chain.address(hop),
                port=ports[hop],
                listen=chain.address(hop),
                host_key=None,
                client_key=client_key,
                extra_config="",
                netns=chain.namespaces[hop],
                jump=jump,
            )
            server.chain = chain
            chain.servers.append(server)
            server.start()
            client_key, jump = server.client_key, server
        known_hosts = write_known_hosts(tmp / "jump-known_hosts", *chain.servers)
        config = write_ssh_config(tmp / "jump-ssh_config", *chain.servers, known_hosts=known_hosts)
        for server in chain.servers:
            server.ssh_config = config
    except BaseException:
        chain.destroy()
        raise
    return list(chain.servers)


def start_jump_pair(tmp: Path) -> tuple[SshServer, SshServer]:
    """A bastion (`rw-bastion`, reachable from here) and an inner server
    (`rw-inner`, `ProxyJump rw-bastion`; reachable only from the bastion's
    namespace): `start_jump_chain(tmp, 2)`. Undo with [`stop_jump_chain`]."""
    bastion, inner = start_jump_chain(tmp, 2, aliases=["rw-bastion", "rw-inner"])
    return bastion, inner


def stop_jump_chain(*servers: SshServer) -> None:
    """Stops the servers of a chain and removes its namespaces, veth and route."""
    chains = {id(s.chain): s.chain for s in servers if s.chain is not None}
    for chain in chains.values():
        chain.destroy()


@contextlib.contextmanager
def running_jump_chain(
    tmp: Path,
    length: int = 3,
    *,
    aliases: Sequence[str] | None = None,
    ports: Sequence[int] | None = None,
) -> Iterator[list[SshServer]]:
    """[`start_jump_chain`], removed on exit."""
    servers = start_jump_chain(tmp, length, aliases=aliases, ports=ports)
    try:
        yield servers
    finally:
        stop_jump_chain(*servers)


@contextlib.contextmanager
def running_jump_pair(tmp: Path) -> Iterator[tuple[SshServer, SshServer]]:
    """`start_jump_pair`, removed on exit."""
    pair = start_jump_pair(tmp)
    try:
        yield pair
    finally:
        stop_jump_chain(*pair)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--supervise"] or sys.argv[3:4] != ["--"] or len(sys.argv) < 6:
        print("usage: sshd.py --supervise LOG -- SSHD [ARG...]", file=sys.stderr)
        sys.exit(2)
    sys.exit(_supervise(sys.argv[2], sys.argv[4:]))
