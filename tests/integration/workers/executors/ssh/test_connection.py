"""The SSH executor's own behaviour beyond the shared contract, its connections
(`workers.executors.ssh`: `connection.py`, `transport.py`): strict host keys,
authentication failures, reconnection, bounded failures, ProxyJump chains, fork
safety, a dying remote shell, one pooled connection per destination. Real OpenSSH
servers throughout (bench/harness/sshd.py). Destinations and ssh_config: test_config.py."""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.processes import children, read_proc
from bench.harness.sshd import (
    SshServer,
    make_key,
    running_jump_chain,
    running_sshd,
    write_known_hosts,
    write_ssh_config,
    write_wrong_known_hosts,
)
from schemas import JobCommand, JobStatus
from workers.executors import CommandError, SshError
from workers.executors.ssh import SshDestination, SshExecutor, connection_pool
from workers.executors.ssh.connection import MAX_SHELLS

from .....conftest import ssh_executor, wait_for
from .....shells import run_script


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SshServer]:
    """A server of this test alone: it may be killed and restarted."""
    with running_sshd(tmp_path / "srv") as started:
        yield started


def executor_with(server: SshServer, workdir: Path, **kw: object) -> SshExecutor:
    options: dict[str, object] = {
        "identity": server.client_key,
        "known_hosts": server.known_hosts,
    }
    options.update(kw)
    return SshExecutor.connect(server.destination, str(workdir), **options)  # type: ignore[arg-type]


# --- host keys and authentication ---------------------------------------------------


def test_an_unknown_host_key_is_refused(sshd: SshServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    executor = executor_with(sshd, tmp_path, known_hosts=empty)
    with pytest.raises(SshError) as raised:
        run_script(executor, "true")
    assert raised.value.kind == "host_key"
    assert "unknown" in raised.value.message
    assert empty.read_text() == ""  # never added


def test_a_missing_known_hosts_file_is_an_unknown_host(sshd: SshServer, tmp_path: Path) -> None:
    executor = executor_with(sshd, tmp_path, known_hosts=tmp_path / "none")
    with pytest.raises(SshError) as raised:
        run_script(executor, "true")
    assert raised.value.kind == "host_key"
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("hashed", [False, True])
def test_a_changed_host_key_is_refused(sshd: SshServer, tmp_path: Path, hashed: bool) -> None:
    wrong = write_wrong_known_hosts(tmp_path / "known_hosts", sshd, hashed=hashed)
    before = wrong.read_text()
    executor = executor_with(sshd, tmp_path, known_hosts=wrong)
    with pytest.raises(SshError) as raised:
        run_script(executor, "true")
    assert raised.value.kind == "host_key"
    assert "CHANGED" in raised.value.message
    assert wrong.read_text() == before


def test_hashed_known_hosts_entries_are_accepted(sshd: SshServer, tmp_path: Path) -> None:
    executor = executor_with(sshd, tmp_path, known_hosts=sshd.known_hosts_hashed)
    assert run_script(executor, "echo ok") == b"ok\n"


def test_a_wrong_key_is_an_auth_error(sshd: SshServer, tmp_path: Path) -> None:
    other = make_key(tmp_path / "other_key")
    with pytest.raises(SshError) as raised:
        run_script(executor_with(sshd, tmp_path, identity=other), "true")
    assert raised.value.kind == "auth"


def test_an_encrypted_key_without_an_agent_never_prompts(
    sshd: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    locked = make_key(tmp_path / "locked_key", passphrase="correct horse")
    started = time.monotonic()
    with pytest.raises(SshError) as raised:
        run_script(executor_with(sshd, tmp_path, identity=locked), "true")
    assert raised.value.kind == "auth"
    assert "encrypted" in raised.value.message
    assert time.monotonic() - started < 15


def test_errors_are_never_bare_paramiko_exceptions(sshd: SshServer, tmp_path: Path) -> None:
    import paramiko

    with pytest.raises(SshError) as raised:
        run_script(executor_with(sshd, tmp_path, identity=make_key(tmp_path / "k")), "true")
    assert not isinstance(raised.value, paramiko.SSHException)
    assert isinstance(raised.value.__cause__, paramiko.SSHException)


# --- reconnection and bounded failures ---------------------------------------------


def test_a_killed_sshd_is_reconnected_transparently(server: SshServer, tmp_path: Path) -> None:
    executor = executor_with(server, tmp_path)
    job = executor.spawn(JobCommand(dir=str(tmp_path / "run"), script="sleep 60"))
    for _ in range(20):
        assert executor.status(job) == JobStatus.RUNNING
    server.kill()
    # While it is down: a clear error, quickly.
    started = time.monotonic()
    with pytest.raises(SshError) as raised:
        executor.status(job)
    assert raised.value.kind in ("connect", "disconnected")
    assert time.monotonic() - started < 15
    server.start()
    # The dead connection is noticed and replaced; the detached job lived on.
    assert executor.status(job) == JobStatus.RUNNING
    executor.cancel(job)
    assert executor.status(job) == JobStatus.CANCELLED


def test_a_restart_between_two_calls_is_invisible(server: SshServer, tmp_path: Path) -> None:
    executor = executor_with(server, tmp_path)
    assert run_script(executor, "echo 1") == b"1\n"
    server.kill()
    server.start()
    assert run_script(executor, "echo 2") == b"2\n"


def test_sshd_down_is_a_connect_error_in_bounded_time(server: SshServer, tmp_path: Path) -> None:
    server.stop()
    started = time.monotonic()
    with pytest.raises(SshError) as raised:
        run_script(executor_with(server, tmp_path), "true")
    assert raised.value.kind == "connect"
    assert time.monotonic() - started < 10


def test_a_server_that_never_answers_times_out(tmp_path: Path) -> None:
    # Accepts TCP, never sends a banner: the connect timeout bounds the wait.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    destination = SshDestination(
        host="127.0.0.1", port=port, known_hosts=(tmp_path / "kh",), connect_timeout_s=1.5
    )
    started = time.monotonic()
    with pytest.raises(SshError) as raised:
        run_script(SshExecutor(destination, str(tmp_path)), "true")
    assert raised.value.kind == "connect"
    assert time.monotonic() - started < 8
    listener.close()


def test_a_dying_remote_shell_is_replaced(sshd: SshServer, tmp_path: Path) -> None:
    executor = ssh_executor(sshd, tmp_path)
    assert run_script(executor, "echo before") == b"before\n"
    # Kill the persistent shell this command runs under (a subshell keeps its $$).
    with pytest.raises(SshError) as raised:
        run_script(executor, "kill -9 $$")
    assert raised.value.kind == "terminated"
    assert run_script(executor, "echo after") == b"after\n"


def test_a_script_past_its_deadline_is_abandoned(sshd: SshServer, tmp_path: Path) -> None:
    executor = ssh_executor(sshd, tmp_path)
    started = time.monotonic()
    with pytest.raises(CommandError, match="timed out"):
        executor.transport.run("sleep 5", action="probe", timeout_s=0.5)
    assert time.monotonic() - started < 3
    assert run_script(executor, "echo next") == b"next\n"


def test_a_cancel_past_its_deadline_frees_the_worker_and_ends_on_the_target(
    sshd: SshServer, tmp_path: Path
) -> None:
    """`run_to_end` (the cancel's) gives up at its deadline; the script, idempotent,
    runs on to its end on the target."""
    executor = ssh_executor(sshd, tmp_path)
    done = tmp_path / "cancel-done"
    started = time.monotonic()
    with pytest.raises(CommandError, match=r"timed out after 0\.5 s"):
        executor.transport.run_to_end(
            f"sleep 1.5; echo done > {done}", action="cancel", timeout_s=0.5
        )
    assert time.monotonic() - started < 3
    wait_for(done.exists, timeout_s=10)
    assert run_script(executor, "echo next") == b"next\n"


def test_waiting_for_a_free_shell_counts_in_the_deadline(sshd: SshServer, tmp_path: Path) -> None:
    """Every shell of the connection busy: a script waits for one no longer than its
    own deadline (a cancel never waits on the follow's scripts for ever)."""
    executor = ssh_executor(sshd, tmp_path)
    run = executor.transport.run
    busy = [
        threading.Thread(target=run, args=("sleep 2",), kwargs={"action": "probe"})
        for _ in range(MAX_SHELLS)
    ]
    for thread in busy:
        thread.start()
    wait_for(lambda: executor.transport.connection._shell_count == MAX_SHELLS)
    started = time.monotonic()
    with pytest.raises(CommandError, match=r"no free shell within 0\.3 s"):
        executor.transport.run_to_end("echo late", action="cancel", timeout_s=0.3)
    assert time.monotonic() - started < 1.5
    for thread in busy:
        thread.join()
    assert run_script(executor, "echo next") == b"next\n"


def test_concurrent_operations_share_one_connection(sshd: SshServer, tmp_path: Path) -> None:
    executors = [ssh_executor(sshd, tmp_path) for _ in range(8)]
    results: list[bytes] = []

    def work(executor: SshExecutor, i: int) -> None:
        for j in range(10):
            results.append(run_script(executor, f"echo {i}-{j}"))

    threads = [threading.Thread(target=work, args=(e, i)) for i, e in enumerate(executors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(f"{i}-{j}\n".encode() for i in range(8) for j in range(10))
    transports = {id(e.transport.connection.open()) for e in executors}
    assert len(transports) == 1


def test_a_forked_child_never_uses_its_parents_connection(sshd: SshServer, tmp_path: Path) -> None:
    executor = ssh_executor(sshd, tmp_path)
    assert run_script(executor, "echo parent") == b"parent\n"
    parent_port = executor.transport.connection.open().sock.getsockname()[1]  # type: ignore[union-attr]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a Celery prefork child would be here
        try:
            os.close(read)
            # Whatever the child inherited may be finalized here at any time: force it.
            from workers.executors.ssh import connection as ssh

            ssh._INHERITED.clear()
            gc.collect()
            out = run_script(executor, "echo child")
            port = executor.transport.connection.open().sock.getsockname()[1]  # type: ignore[union-attr]
            os.write(write, f"{out.decode().strip()} {port}".encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 100).decode().split()
    os.waitpid(pid, 0)
    assert answer[0] == "child"
    assert int(answer[1]) != parent_port
    # The parent's connection was left alone.
    assert run_script(executor, "echo again") == b"again\n"
    assert executor.transport.connection.open().sock.getsockname()[1] == parent_port  # type: ignore[union-attr]


# --- ProxyJump ---------------------------------------------------------------------


def test_proxyjump_through_a_bastion(tmp_path: Path) -> None:
    with running_jump_chain(tmp_path, 2, aliases=["rw-bastion", "rw-inner"]) as (_, inner):
        executor = SshExecutor.connect(
            "rw-inner", str(tmp_path / "work"), ssh_config=inner.ssh_config
        )
        assert [hop.alias for hop in executor.destination.jumps] == ["rw-bastion"]
        job = executor.spawn(JobCommand(dir=str(tmp_path / "work" / "run"), script="sleep 60"))
        assert executor.status(job) == JobStatus.RUNNING
        executor.cancel(job)
        assert executor.status(job) == JobStatus.CANCELLED
        executor.close()


def test_a_chain_of_two_jumps(tmp_path: Path) -> None:
    with running_jump_chain(tmp_path, 3) as servers:
        executor = SshExecutor.connect("rw-hop2", str(tmp_path), ssh_config=servers[2].ssh_config)
        # rw-hop2 jumps through rw-hop1, whose own ProxyJump is rw-hop0.
        assert [hop.alias for hop in executor.destination.route] == [
            "rw-hop0",
            "rw-hop1",
            "rw-hop2",
        ]
        assert run_script(executor, "echo deep") == b"deep\n"
        executor.close()


def test_every_hop_is_host_key_checked(tmp_path: Path) -> None:
    with running_jump_chain(tmp_path, 2, aliases=["rw-bastion", "rw-inner"]) as (bastion, inner):
        # known_hosts right for the bastion, wrong for the inner server.
        known = write_known_hosts(tmp_path / "mixed", bastion)
        wrong = write_wrong_known_hosts(tmp_path / "wrong-inner", inner)
        known.write_text(known.read_text() + wrong.read_text())
        config = write_ssh_config(tmp_path / "cfg", bastion, inner, known_hosts=known)
        executor = SshExecutor.connect("rw-inner", str(tmp_path), ssh_config=config)
        with pytest.raises(SshError) as raised:
            run_script(executor, "true")
        assert raised.value.kind == "host_key"
        assert "CHANGED" in raised.value.message


# --- ProxyCommand ------------------------------------------------------------------


def _proxied_config(tmp_path: Path, inner: SshServer, chain_config: Path, command: str) -> Path:
    """The chain's ssh config plus `rw-proxied`: the inner server, reached through
    `command` (a ProxyCommand) instead of a ProxyJump."""
    block = "\n".join([
        "Host rw-proxied",
        f"  HostName {inner.host}",
        f"  Port {inner.port}",
        f"  User {inner.user}",
        f"  IdentityFile {inner.client_key}",
        f"  UserKnownHostsFile {inner.known_hosts}",
        f"  ProxyCommand {command}",
    ])  # fmt: skip
    path = tmp_path / "proxied_config"
    path.write_text(chain_config.read_text() + "\n" + block + "\n", encoding="utf-8")
    return path


def test_proxycommand_through_a_bastion(tmp_path: Path) -> None:
    """The inner server is reachable only through the bastion (network namespaces):
    OpenSSH's own `ssh -W %h:%p` as the ProxyCommand gets there, `%h` and `%p`
    expanded; the proxy ends with the connection."""
    with running_jump_chain(tmp_path, 2, aliases=["rw-bastion", "rw-inner"]) as (_, inner):
        command = f"ssh -F {inner.ssh_config} -W %h:%p rw-bastion"
        config = _proxied_config(tmp_path, inner, inner.ssh_config, command)
        executor = SshExecutor.connect("rw-proxied", str(tmp_path), ssh_config=config)
        expected = command.replace("%h", inner.host).replace("%p", str(inner.port))
        assert executor.destination.proxy_command == expected
        assert run_script(executor, "echo through") == b"through\n"
        proxies = [
            p
            for p in children(os.getpid())
            if b"-W" in read_proc(f"/proc/{p}/cmdline").split(b"\0")
        ]
        assert len(proxies) == 1
        executor.close()
        # Ended and reaped: not even a zombie left.
        assert not any(Path(f"/proc/{p}").exists() for p in proxies)


def test_a_proxycommand_that_fails_is_a_connect_error_and_leaves_nothing(tmp_path: Path) -> None:
    with running_jump_chain(tmp_path, 2, aliases=["rw-bastion", "rw-inner"]) as (_, inner):
        config = _proxied_config(tmp_path, inner, inner.ssh_config, "false %h %p")
        executor = SshExecutor.connect("rw-proxied", str(tmp_path), ssh_config=config)
        with pytest.raises(SshError) as raised:
            run_script(executor, "true")
        assert raised.value.kind == "connect"
        executor.close()


# --- the pool ----------------------------------------------------------------------


def test_the_pool_is_per_destination(sshd: SshServer, tmp_path: Path) -> None:
    one, two = ssh_executor(sshd, tmp_path), ssh_executor(sshd, tmp_path / "other")
    assert one.transport.connection is two.transport.connection
    assert connection_pool().get(one.destination) is one.transport.connection
    wait_for(lambda: run_script(one, "true") == b"")
