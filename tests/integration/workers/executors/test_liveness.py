"""A job's liveness read by the worker itself (`workers.executors.liveness`), with real
process groups, and the status of a target on this machine that asks its script only
for the jobs the kernel does not show running: a script's answer (forged here by its
transport, as a process of the job's user can forge it on a run-as target) never
ends a live job."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from schemas import JobCommand, JobId, JobStatus
from schemas.protocol import EXIT_FILE
from workers.executors import Completed, LocalTransport, ScriptExecutor
from workers.executors.liveness import group_is_the_jobs
from workers.executors.transport import DEFAULT_TIMEOUT_S

from ....conftest import wait_for


def _start_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b") ")[2].split()
    return int(fields[19])


@pytest.fixture
def leader() -> Iterator[subprocess.Popen[bytes]]:
    """A `sleep` leading a process group of its own."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_live_group_is_the_job_s_only_with_its_leader_s_start(
    leader: subprocess.Popen[bytes],
) -> None:
    start = _start_of(leader.pid)
    assert group_is_the_jobs(leader.pid, start)
    assert not group_is_the_jobs(leader.pid, start + 1)  # the pid went to another process


def test_a_group_whose_leader_ended_is_alive_while_a_member_is() -> None:
    # The leader forks a member of its group, then execs; the member outlives it.
    leader = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 600 & echo $!; exec sleep 601"],
        start_new_session=True, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert leader.stdout is not None
        member = int(leader.stdout.readline())
        start = _start_of(leader.pid)
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()  # reaped: no process has the leader's pid; its member runs on
        assert group_is_the_jobs(leader.pid, start)
        assert os.getpgid(member) == leader.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    assert group_is_the_jobs(leader.pid, start)  # a zombie member, not reaped yet
    # The orphan is this process's: the test run is a subreaper (tests/conftest.py).
    os.waitpid(member, 0)
    assert not group_is_the_jobs(leader.pid, start)


def test_a_zombie_leader_is_alive_until_reaped(leader: subprocess.Popen[bytes]) -> None:
    start = _start_of(leader.pid)
    os.killpg(leader.pid, signal.SIGKILL)
    wait_for(lambda: Path(f"/proc/{leader.pid}/stat").read_text().rpartition(") ")[2][0] == "Z")
    assert group_is_the_jobs(leader.pid, start)  # whoever started the job reaps it
    leader.wait()
    assert not group_is_the_jobs(leader.pid, start)


@pytest.mark.parametrize("pgid", [-1, 0, 1])
def test_no_group_is_asked_for_the_wildcards_or_init(pgid: int) -> None:
    with pytest.raises(ValueError, match="no job's process group"):
        group_is_the_jobs(pgid, 1)


class ForgingTransport(LocalTransport):
    """A local transport whose status scripts answer `exited 0` for every job they are
    asked, as a process of the job's user writing into their output would; it
    records how many jobs each status script was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[int] = []

    def run(
        self,
        script: str,
        *,
        action: str,
        stdin: bytes = b"",
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        args: Sequence[str] = (),
    ) -> Completed:
        if action != "status":
            return super().run(script, action=action, stdin=stdin, timeout_s=timeout_s, args=args)
        count = len(args) // 3
        self.asked.append(count)
        return Completed(0, b"exited 0\n" * count, b"")


class HereExecutor(ScriptExecutor):
    ON_THIS_MACHINE = True


def test_a_script_that_reports_a_live_job_ended_is_not_asked(tmp_path: Path) -> None:
    transport = ForgingTransport()
    executor = HereExecutor(transport, str(tmp_path))
    live = executor.spawn(JobCommand(dir=str(tmp_path / "live"), script="exec sleep 600"))
    ended = executor.spawn(JobCommand(dir=str(tmp_path / "ended"), script="exit 4"))
    try:
        wait_for((tmp_path / "ended" / EXIT_FILE).exists)
        wait_for(lambda: executor.statuses([ended]) == [JobStatus.exited(0)])
        transport.asked.clear()
        assert executor.statuses([live, ended, live]) == [
            JobStatus.RUNNING,
            JobStatus.exited(0),  # the script's word, for the job the kernel shows ended
            JobStatus.RUNNING,
        ]
        assert transport.asked == [1]
        assert executor.status(live) is JobStatus.RUNNING
        assert transport.asked == [1]  # no script at all
        # A job whose start is unknown (adopted) is the script's to decide.
        adopted = JobId(dir=live.dir, pid=live.pid)
        assert executor.status(adopted) == JobStatus.exited(0)
    finally:
        os.killpg(live.pid, signal.SIGKILL)
    wait_for(lambda: executor.statuses([live]) == [JobStatus.exited(0)])


def test_a_target_elsewhere_asks_its_script_for_every_job(tmp_path: Path) -> None:
    transport = ForgingTransport()
    executor = ScriptExecutor(transport, str(tmp_path))
    live = executor.spawn(JobCommand(dir=str(tmp_path / "live"), script="exec sleep 600"))
    try:
        assert executor.status(live) == JobStatus.exited(0)
        assert transport.asked == [1]
    finally:
        os.killpg(live.pid, signal.SIGKILL)
