"""A spawn over SSH whose answer is lost after the remote job started, with a real
sshd on loopback and a real redis-server: the spawn times out (the connection stalls)
or its connection breaks; the launch looks in the run directory, finds the job and
follows it, instead of recording the run failed while its job runs on. The jobs are
counted on the machine (bench/harness/processes.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.harness.pipeline import toy
from bench.harness.processes import assert_one_followed_job, children, read_proc, trainers
from bench.harness.redis_server import running_redis
from bench.harness.sshd import SshServer, running_sshd
from schemas import JobCommand, JobId, RunState, Settings
from schemas.events import LaunchSpec
from store import RunStore
from workers import launch as launching
from workers.context import Context
from workers.executors import CommandError, ExecError, ScriptExecutor, ScriptTimeout, quote
from workers.executors.ssh import SshTransport, resolve_destination

from ...conftest import put_signed_target, wait_for
from ...shells import run_script

pytestmark = pytest.mark.slow

TRAIN = ("--steps", "100000", "--step-time", "0.05")


class _ShortSpawn(SshTransport):
    """The SSH transport with a 3 s deadline on a spawn (the default is minutes)."""

    def run(self, script: str, *, action: str, **kwargs: Any) -> Any:
        if action == "spawn":
            kwargs["timeout_s"] = 3.0
        return super().run(script, action=action, **kwargs)


class _Watched(ScriptExecutor):
    """The executor, noting how its spawns failed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spawn_failed = threading.Event()
        self.spawn_errors: list[Exception] = []

    def spawn(self, job: JobCommand) -> JobId:
        try:
            return super().spawn(job)
        except Exception as error:
            self.spawn_errors.append(error)
            self.spawn_failed.set()
            raise


def sshd_sessions(server: SshServer) -> list[int]:
    """The per-connection sshd processes of `server` (not its listener)."""
    assert server.process is not None
    found, todo = [], [server.process.pid]
    while todo:
        for child in children(todo.pop()):
            todo.append(child)
            name = os.path.basename(read_proc(f"/proc/{child}/cmdline").split(b"\0")[0])
            if name.startswith(b"sshd") and child != server.sshd_pid:
                found.append(child)
    return found


@pytest.fixture
def freezing_setsid(tmp_path: Path) -> tuple[Path, Path]:
    """A directory holding a `setsid` that, when the order file exists, takes it (a
    rename: once) and sends the signal it names to the pids it lists, then runs the
    real `setsid`: a fault at the spawn, after the launcher started and before the
    job did. Returns the directory and the order file."""
    real = shutil.which("setsid")
    assert real is not None, "setsid is not installed"
    shim, order = tmp_path / "shim", tmp_path / "order"
    shim.mkdir()
    script = shim / "setsid"
    script.write_text(
        "#!/bin/sh\n"
        f"if mv -- {quote(str(order))} {quote(str(order))}.taken 2>/dev/null; then\n"
        f"  read -r rw_sig rw_pids < {quote(str(order))}.taken\n"
        '  kill -"$rw_sig" $rw_pids\n'
        "fi\n"
        f'exec {quote(real)} "$@"\n'
    )
    script.chmod(0o755)
    return shim, order


@pytest.mark.parametrize("fault", ["timeout", "disconnect"])
def test_an_ssh_spawn_whose_answer_is_lost_after_the_job_started_is_followed(
    tmp_path: Path, freezing_setsid: tuple[Path, Path], fault: str
) -> None:
    """Over a real sshd, the spawn's launcher freezes (SIGSTOP) or kills (SIGKILL) the
    sshd processes serving the worker's connection just before it starts the job, so
    the spawn's answer never comes: it times out (3 s; the connection thaws after) or
    the connection breaks (a new one is opened). The launch looks in the run
    directory, finds the job, and follows it: the run is running with that job, not
    failed."""
    shim, order = freezing_setsid
    path = f"SetEnv PATH={shim}:/usr/local/bin:/usr/bin:/bin\n"
    with (
        running_sshd(tmp_path, extra_config=path) as server,
        running_redis(tmp_path / "redis") as redis_server,
    ):
        workdir = server.workdir
        transport = _ShortSpawn(
            resolve_destination(
                server.destination, identity=server.client_key, known_hosts=server.known_hosts
            )
        )
        executor = _Watched(transport, str(workdir))
        store = RunStore.from_url(redis_server.url)
        settings = Settings(state_dir=tmp_path / "state")
        ctx = Context(store, settings, lambda *a: None, "test")
        # The launch reads its target's permits (the executor below stands in for it).
        put_signed_target(
            store,
            settings,
            {
                "name": "ssh",
                "kind": "ssh",
                "workdir": str(workdir),
                "ssh": {
                    "destination": server.destination,
                    "identity": str(server.client_key),
                    "known_hosts": str(server.known_hosts),
                },
            },
        )
        ctx.executor_for = lambda config: executor  # type: ignore[method-assign,assignment,return-value]
        run_script(executor, "true")  # the connection the launch will use
        sessions = sshd_sessions(server)
        assert sessions
        sig = "STOP" if fault == "timeout" else "KILL"
        order.write_text(f"{sig} {' '.join(str(p) for p in sessions)}\n")
        spec = LaunchSpec(target="ssh", command=toy(*TRAIN), name="ssh", key="ssh-" + fault)

        def thaw() -> None:
            if executor.spawn_failed.wait(60) and fault == "timeout":
                time.sleep(0.5)
                for pid in sessions:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)

        thawing = threading.Thread(target=thaw, daemon=True)
        thawing.start()
        try:
            record = launching.launch(ctx, spec, datetime.now(UTC))
            assert not order.exists()  # the fault happened
            (error,) = executor.spawn_errors  # the spawn failed
            assert isinstance(error, CommandError if fault == "timeout" else ExecError), error
            if fault == "timeout":
                assert isinstance(error, ScriptTimeout)
                assert "timed out after 3 s" in str(error)
            assert record.state is RunState.RUNNING
            assert record.message is None
            assert record.job is not None
            # The job found may not have exec'd its trainer yet.
            run_dir = Path(record.remote_dir)
            wait_for((run_dir / "metrics.jsonl").exists, timeout_s=20)
            assert assert_one_followed_job(store, record.id) == record
            assert len(trainers(record.id)) == 1
            assert [p.name for p in workdir.iterdir()] == [record.id]
            executor.cancel(record.job)
            wait_for(lambda: trainers(record.id) == {}, timeout_s=30)
        finally:
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            thawing.join(5)
            executor.close()
