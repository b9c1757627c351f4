"""Self-tests of the sshd fixture (`bench/harness/sshd.py`), with OpenSSH's own client and
with paramiko: key authentication, strict known_hosts (plain and hashed), restart on
the same port with the same key, kill dropping live sessions, reaping, and ProxyJump
through network namespaces."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from bench.harness.sshd import (
    SshdError,
    SshServer,
    make_key,
    running_jump_chain,
    running_jump_pair,
    running_sshd,
    start_sshd,
    stop_jump_chain,
    write_known_hosts,
    write_ssh_config,
    write_wrong_known_hosts,
)
from bench.harness.users import WORKER_USER, ensure_login_user, shared_dir
from tests.conftest import process_alive

SSH_TIMEOUT_S = 20


def run_ssh(
    server: SshServer, *command: str, options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        server.ssh_argv(*command, options=options),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SSH_TIMEOUT_S,
        check=False,
    )


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except FileNotFoundError:
        return None


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def paramiko_client(known_hosts: Path) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def paramiko_connect(
    client: paramiko.SSHClient, server: SshServer, sock: paramiko.Channel | None = None
) -> None:
    client.connect(
        server.host,
        server.port,
        username=server.user,
        key_filename=str(server.client_key),
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
        banner_timeout=10,
        auth_timeout=10,
        sock=sock,
    )


def remote_output(client: paramiko.SSHClient, command: str) -> str:
    _, stdout, _ = client.exec_command(command, timeout=10)
    return stdout.read().decode()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SshServer]:
    with running_sshd(tmp_path) as running:
        yield running


# --- one server, OpenSSH client ----------------------------------------------------


def test_key_auth_and_strict_known_hosts_with_openssh(server: SshServer) -> None:
    assert server.host == "127.0.0.1"
    assert server.destination == f"{server.user}@127.0.0.1:{server.port}"
    assert server.client_key.stat().st_mode & 0o777 == 0o600
    assert server.known_hosts.read_text().startswith(f"[127.0.0.1]:{server.port} ssh-ed25519 ")
    config = server.ssh_config.read_text()
    for line in (
        "Host rw-target",
        "StrictHostKeyChecking yes",
        "IdentitiesOnly yes",
        f"Port {server.port}",
        f"UserKnownHostsFile {server.known_hosts}",
    ):
        assert line in config

    done = run_ssh(server, "true")
    assert done.returncode == 0, done.stderr
    done = run_ssh(server, "id -un; pwd")
    assert done.stdout.split() == [server.user, os.path.expanduser("~" + server.user)]


def test_hashed_known_hosts_work_with_openssh(server: SshServer) -> None:
    hashed = server.known_hosts_hashed.read_text()
    assert hashed.startswith("|1|")
    assert "127.0.0.1" not in hashed
    option = f"UserKnownHostsFile={server.known_hosts_hashed}"
    done = run_ssh(server, "true", options=("-o", option))
    assert done.returncode == 0, done.stderr


def test_unknown_host_key_is_refused(server: SshServer, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    done = run_ssh(
        server,
        "true",
        options=("-o", f"UserKnownHostsFile={empty}", "-o", "StrictHostKeyChecking=yes"),
    )
    assert done.returncode == 255
    assert "Host key verification failed" in done.stderr
    assert empty.read_text() == ""


@pytest.mark.parametrize("hashed", [False, True])
def test_changed_host_key_is_refused(server: SshServer, tmp_path: Path, hashed: bool) -> None:
    wrong = write_wrong_known_hosts(tmp_path / "wrong_known_hosts", server, hashed=hashed)
    assert server.host_key_pub.split()[1] not in wrong.read_text()
    done = run_ssh(server, "true", options=("-o", f"UserKnownHostsFile={wrong}"))
    assert done.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in done.stderr


def test_other_client_key_is_refused(server: SshServer, tmp_path: Path) -> None:
    other = make_key(tmp_path / "other_key")
    config = write_ssh_config(tmp_path / "other_config", server, identity=other)
    done = subprocess.run(
        ["ssh", "-F", str(config), server.alias, "true"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SSH_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 255
    assert "Permission denied (publickey)" in done.stderr


def test_restart_keeps_port_and_host_key(server: SshServer) -> None:
    port, reaper = server.port, server.process
    assert reaper is not None
    server.kill()
    assert not server.is_running
    assert refused(server.host, port)
    server.start()
    assert server.port == port
    assert server.process is reaper, "the same reaper runs the new sshd"
    done = run_ssh(server, "true")  # strict known_hosts: the host key is the same
    assert done.returncode == 0, done.stderr
    server.start()  # running: nothing happens
    assert run_ssh(server, "true").returncode == 0


def test_kill_drops_a_live_session(server: SshServer) -> None:
    session = subprocess.Popen(
        server.ssh_argv("echo ready; exec sleep 30"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert session.stdout is not None
        assert session.stdout.readline() == "ready\n"
        started = time.monotonic()
        server.kill()
        assert session.wait(timeout=5) == 255
        assert time.monotonic() - started < 5
        assert refused(server.host, server.port)
    finally:
        session.kill()
        session.wait()


def test_kill_leaves_detached_processes_which_are_reaped(server: SshServer) -> None:
    done = run_ssh(server, "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!")
    pid = int(done.stdout)
    assert process_alive(pid)
    assert server.process is not None
    server.kill()
    assert process_alive(pid), "a job outlives sshd"
    # Its parent ended: it is a child of the server's reaper, which reaps it.
    reaper = server.process.pid
    wait_until(lambda: parent(pid) == reaper)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not exists(pid))  # reaped, not a zombie


def test_stop_leaves_nothing_running(server: SshServer) -> None:
    done = run_ssh(server, "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!")
    job = int(done.stdout)
    assert server.process is not None
    reaper, sshd = server.process.pid, server.sshd_pid
    assert sshd is not None
    server.stop()
    assert not exists(job)
    assert not exists(sshd)
    assert not exists(reaper)
    assert refused(server.host, server.port)
    server.start()  # and it comes back
    assert run_ssh(server, "true").returncode == 0


def test_a_delegated_server_logs_its_user_in_to_a_cgroup_of_its_own() -> None:
    """`delegate=True`: every session of the login (not root) runs in the server's
    cgroup, which is the login's (its directory and `cgroup.procs`), after a restart
    too; `stop()` ends what a session left there and removes the cgroup."""
    user = ensure_login_user(WORKER_USER)
    with shared_dir("rw-sshd-delegated-") as base:
        server = start_sshd(base, login=WORKER_USER, delegate=True)
        try:
            cgroup = server.cgroup
            assert cgroup is not None
            assert cgroup.stat().st_uid == (cgroup / "cgroup.procs").stat().st_uid == user.pw_uid
            mount = cgroup.parent
            done = run_ssh(
                server,
                "cat /proc/self/cgroup; setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!",
            )
            lines = done.stdout.splitlines()
            assert f"0::/{cgroup.relative_to(mount)}" in lines, done.stderr
            left = int(lines[-1])
            server.kill()
            server.start()
            assert server.cgroup == cgroup
            done = run_ssh(server, "cat /proc/self/cgroup")
            assert f"0::/{cgroup.relative_to(mount)}" in done.stdout.splitlines()
        finally:
            server.stop()
        assert not exists(left)
        assert not cgroup.exists()
        assert server.cgroup is None


def test_bad_sshd_config_raises_with_sshd_words(tmp_path: Path) -> None:
    with pytest.raises(SshdError, match="NoSuchOption"):
        start_sshd(tmp_path, extra_config="NoSuchOption yes")


def test_taken_port_raises_with_the_log(server: SshServer, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(SshdError, match="Bind to port"):
        start_sshd(tmp_path, name="b", port=server.port)
    assert time.monotonic() - started < 5


def test_two_servers_and_a_given_host_key(server: SshServer, tmp_path: Path) -> None:
    with running_sshd(tmp_path, name="b", host_key=server.host_key, alias="rw-b") as other:
        assert other.port != server.port
        assert other.host_key_pub == server.host_key_pub
        assert run_ssh(other, "true").returncode == 0


# --- paramiko -----------------------------------------------------------------------


@pytest.mark.parametrize("hashed", [False, True])
def test_paramiko_reject_policy_with_known_hosts(server: SshServer, hashed: bool) -> None:
    known_hosts = server.known_hosts_hashed if hashed else server.known_hosts
    client = paramiko_client(known_hosts)
    try:
        paramiko_connect(client, server)
        assert remote_output(client, "echo ok") == "ok\n"
    finally:
        client.close()


def test_paramiko_unknown_and_changed_host_keys(server: SshServer, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    client = paramiko_client(empty)
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        paramiko_connect(client, server)
    client.close()

    client = paramiko_client(write_wrong_known_hosts(tmp_path / "wrong", server, hashed=True))
    with pytest.raises(paramiko.BadHostKeyException):
        paramiko_connect(client, server)
    client.close()


# --- ProxyJump ----------------------------------------------------------------------


def test_proxyjump_pair(tmp_path: Path) -> None:
    with running_jump_pair(tmp_path) as (bastion, inner):
        assert inner.jump is bastion
        assert bastion.chain is not None
        assert inner.chain is bastion.chain
        assert bastion.known_hosts.read_text().startswith(f"[{bastion.host}]:2222 ssh-ed25519 ")
        assert inner.known_hosts.read_text().startswith(f"{inner.host} ssh-ed25519 ")
        assert "ProxyJump rw-bastion" in inner.ssh_config.read_text()

        done = run_ssh(inner, "echo $SSH_CONNECTION")
        assert done.returncode == 0, done.stderr
        # The inner server sees the connection come from the bastion's namespace.
        assert done.stdout.split()[0] == bastion.chain.upstream(1)

        done = subprocess.run(
            ["ssh", "-F", str(inner.ssh_config), "-J", "rw-bastion", "rw-inner-direct", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SSH_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr

        # From here, the inner server cannot be reached, and it fails at once.
        started = time.monotonic()
        with pytest.raises(OSError, match="No route to host") as error:
            socket.create_connection((inner.host, inner.port), timeout=5)
        assert error.value.errno == errno.EHOSTUNREACH
        done = subprocess.run(
            ["ssh", "-F", str(inner.ssh_config), "rw-inner-direct", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SSH_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 255
        assert "No route to host" in done.stderr
        assert time.monotonic() - started < 3
        # The bastion's namespace reaches it.
        assert bastion.probe(inner.host, inner.port) is None


def test_paramiko_direct_tcpip_through_the_bastion(tmp_path: Path) -> None:
    with running_jump_pair(tmp_path) as (bastion, inner):
        known_hosts = write_known_hosts(tmp_path / "kh", bastion, inner, hashed=True)
        outer = paramiko_client(known_hosts)
        client = paramiko_client(known_hosts)
        try:
            paramiko_connect(outer, bastion)
            transport = outer.get_transport()
            assert transport is not None
            channel = transport.open_channel(
                "direct-tcpip", (inner.host, inner.port), ("127.0.0.1", 0), timeout=10
            )
            paramiko_connect(client, inner, sock=channel)
            assert remote_output(client, "echo inner") == "inner\n"

            # The inner server restarts in its namespace, same address and key.
            inner.kill()
            with pytest.raises(paramiko.ChannelException):
                transport.open_channel(
                    "direct-tcpip", (inner.host, inner.port), ("127.0.0.1", 0), timeout=10
                )
            inner.start()
            client.close()
            client = paramiko_client(known_hosts)
            channel = transport.open_channel(
                "direct-tcpip", (inner.host, inner.port), ("127.0.0.1", 0), timeout=10
            )
            paramiko_connect(client, inner, sock=channel)
            assert remote_output(client, "echo again") == "again\n"
        finally:
            client.close()
            outer.close()


def test_two_hop_chain(tmp_path: Path) -> None:
    with running_jump_chain(tmp_path, 3) as (hop0, hop1, hop2):
        assert hop2.jump is hop1
        assert hop1.jump is hop0
        done = run_ssh(hop2, "echo $SSH_CONNECTION")  # ProxyJump resolved hop by hop
        assert done.returncode == 0, done.stderr
        assert hop1.chain is not None
        assert done.stdout.split()[0] == hop1.chain.upstream(2)
        done = subprocess.run(
            [
                "ssh",
                "-F",
                str(hop2.ssh_config),
                "-J",
                "rw-hop0,rw-hop1-direct",
                "rw-hop2-direct",
                "true",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SSH_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        # Each hop reaches the next one only.
        assert hop0.probe(hop1.host, hop1.port) is None
        assert hop1.probe(hop2.host, hop2.port) is None
        assert "unreachable" in (hop0.probe(hop2.host, hop2.port) or "")
        with pytest.raises(OSError, match="No route to host"):
            socket.create_connection((hop1.host, hop1.port), timeout=5)


def _network_state() -> str:
    return "".join(
        subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
        for args in (["netns", "list"], ["-o", "link"], ["route"])
    )


def test_chain_teardown_removes_everything(tmp_path: Path) -> None:
    with running_jump_pair(tmp_path) as (bastion, inner):
        chain = bastion.chain
        assert chain is not None
        names = [*chain.namespaces, f"rwt{chain.index}h0", str(chain.block)]
        state = _network_state()
        assert all(name in state for name in names)
        reapers = [s.process.pid for s in (bastion, inner) if s.process]
    state = _network_state()
    assert [name for name in names if name in state] == []
    assert not any(exists(pid) for pid in reapers)
    stop_jump_chain(bastion, inner)  # twice is fine
