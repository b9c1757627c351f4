"""`SlurmExecutor` against a real single-node Slurm cluster (munged, slurmctld and slurmd
on loopback: bench/harness/slurm.py), its login node this machine and, once, the test
sshd: submission with hostile values, secrets that reach the job and nowhere else,
status from Slurm and the run directory (a job cannot write its own end), a job held
pending and cancelled before it starts, a cancel that ends a job deaf to SIGTERM,
Slurm's notices turned into requests, and the job side's proof."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bench.harness.slurm import SlurmCluster
from bench.harness.sshd import SshServer, start_sshd
from schemas import JobCommand, JobId, JobStatus
from schemas.job import Container
from schemas.targets import SlurmOptions
from tests.conftest import ssh_executor, toy_command, toy_env, wait_for
from workers.executors import CommandError, InvalidArgument
from workers.executors.local import job_environment
from workers.executors.scripts import FollowEntry
from workers.executors.slurm import SlurmExecutor, parse_squeue
from workers.executors.transport import LocalTransport

SECRET = 's3cr\'et "$(touch /tmp/rw-pwned)" `id` \\ ;'


@pytest.fixture(scope="module")
def work(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slurm-work")


@pytest.fixture(scope="module")
def executor(slurm: SlurmCluster, work: Path) -> SlurmExecutor:
    return SlurmExecutor(LocalTransport(env=job_environment(os.environ)), str(work), SlurmOptions())


def _state(slurm: SlurmCluster, job: JobId) -> str | None:
    return slurm.state(str(job.slurm))


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_job_runs_with_its_variables_and_secrets_to_its_exit_code(
    slurm: SlurmCluster, executor: SlurmExecutor, work: Path
) -> None:
    run = work / "run 'one\" $x"
    hostile = "a'b\"$(touch /tmp/rw-pwned)`id`;\\ \t end"
    job = executor.spawn(
        JobCommand(
            dir=str(run),
            script='printf "%s|%s\\n" "$GREETING" "$TOKEN" > seen\necho to-the-log\nexit 3',
            env={"GREETING": hostile},
            secrets={"TOKEN": SecretStr(SECRET)},
        )
    )
    assert job.slurm is not None
    assert job.pid == 2**22 + 1
    # Queued or running, Slurm says so; the files cannot say otherwise yet.
    assert executor.status(job) in (JobStatus.RUNNING, JobStatus.exited(3))
    wait_for(lambda: executor.status(job) == JobStatus.exited(3), 30)
    assert (run / "seen").read_text() == f"{hostile}|{SECRET}\n"
    assert not Path("/tmp/rw-pwned").exists()
    assert executor.slurm_states([job])[job.slurm].state == "FAILED"  # exit 3
    # The secret is in no batch script and on no command line Slurm keeps.
    script = slurm.run("scontrol", "write", "batch_script", str(job.slurm), "-")
    assert "printf" in script
    assert SECRET not in script
    assert SECRET not in slurm.run("scontrol", "show", "job", "-d", str(job.slurm))
    [update] = executor.follow([FollowEntry(job, 0, 0)])
    assert update.status == JobStatus.exited(3)
    assert update.log == b"to-the-log\n"


def test_a_job_that_writes_its_own_end_is_running_while_slurm_runs_it(
    slurm: SlurmCluster, executor: SlurmExecutor, work: Path
) -> None:
    run = work / "forger"
    job = executor.spawn(
        JobCommand(dir=str(run), script="echo 0 > exit_code; : > cancelled; exec sleep 300")
    )
    slurm.wait_state(str(job.slurm), {"RUNNING"})
    wait_for((run / "cancelled").exists, 10)
    assert executor.statuses([job]) == [JobStatus.RUNNING]
    [update] = executor.follow([FollowEntry(job, 0, 0)])
    assert update.status == JobStatus.RUNNING
    executor.cancel(job)
    assert executor.status(job) == JobStatus.CANCELLED
    assert _state(slurm, job) not in {"RUNNING", "COMPLETING"}


def test_a_job_held_pending_is_cancelled_before_it_starts(
    slurm: SlurmCluster, executor: SlurmExecutor, work: Path
) -> None:
    blocker = slurm.run(
        "sbatch", "--parsable", f"--cpus-per-task={slurm.cpus}", "--wrap", "sleep 300"
    ).strip()
    try:
        slurm.wait_state(blocker, {"RUNNING"})
        run = work / "pending"
        job = executor.spawn(JobCommand(dir=str(run), script=": > started; sleep 300"))
        assert slurm.wait_state(str(job.slurm), {"PENDING"}) == "PENDING"
        # The scheduler gives its reason at its next pass.
        wait_for(lambda: str(executor.slurm_states([job])[job.slurm]) != "PENDING", 30)  # type: ignore[index]
        assert str(executor.slurm_states([job])[job.slurm]).startswith("PENDING (")  # type: ignore[index]
        assert executor.status(job) == JobStatus.RUNNING
        began = time.monotonic()
        executor.cancel(job)
        assert time.monotonic() - began < 5
        assert executor.status(job) == JobStatus.CANCELLED
        assert _state(slurm, job) == "CANCELLED"
        assert not (run / "started").exists()
        executor.cancel(job)  # a no-op now
    finally:
        slurm.run("scancel", blocker, check=False)


def test_cancel_ends_a_job_deaf_to_sigterm_and_its_children(
    slurm: SlurmCluster, executor: SlurmExecutor, work: Path
) -> None:
    run = work / "deaf"
    script = (
        "trap '' TERM USR1\n"
        "for i in 1 2 3; do (trap '' TERM; exec sleep 300) & echo $! >> children; done\n"
        "wait"
    )
    job = executor.spawn(JobCommand(dir=str(run), script=script))
    children_file = run / "children"
    wait_for(lambda: children_file.exists() and len(children_file.read_text().split()) == 3, 30)
    children = [int(p) for p in (run / "children").read_text().split()]
    began = time.monotonic()
    executor.cancel(job)
    took = time.monotonic() - began
    assert 9 < took < 25, took  # SIGTERM was ignored: SIGKILL after KillWait (10 s)
    assert executor.status(job) == JobStatus.CANCELLED
    wait_for(lambda: all(_gone(pid) for pid in children), 10)
    assert not (run / "exit_code").exists()


def test_slurms_notices_become_requests_and_the_job_side_proves(
    slurm: SlurmCluster, executor: SlurmExecutor, work: Path
) -> None:
    # USR1 to the batch shell only is what `--signal=B:USR1@<lead>` sends before the
    # time limit: a `deadline` request, which the toy trainer proves and stops on.
    run = work / "notice"
    job = executor.spawn(
        JobCommand(
            dir=str(run),
            script=toy_command("--steps", "100000", "--step-time", "0.05", "--save-every", "0"),
            env=toy_env(str(run)),
        )
    )
    slurm.wait_state(str(job.slurm), {"RUNNING"})
    wait_for(lambda: (run / "job.log").exists() and b"step" in (run / "job.log").read_bytes(), 30)
    slurm.run("scancel", "--batch", "--signal=USR1", str(job.slurm))
    wait_for(lambda: executor.status(job) != JobStatus.RUNNING, 30)
    assert (run / "snapshot.request").read_text() == "deadline"
    assert executor.status(job) == JobStatus.exited(0)
    assert '"reason": "deadline"' in (run / "snapshot.json").read_text().replace('":"', '": "')


def test_the_watchdog_asks_for_the_deadline_snapshot(
    slurm: SlurmCluster, executor: SlurmExecutor, work: Path
) -> None:
    run = work / "watchdog"
    job = executor.spawn(JobCommand(dir=str(run), script="sleep 300", deadline_request_after_s=0.5))
    wait_for((run / "snapshot.request").exists, 30)
    assert (run / "snapshot.request").read_text() == "deadline"
    executor.cancel(job)
    assert executor.status(job) == JobStatus.CANCELLED


def test_what_sbatch_refuses_is_an_error_and_nothing_runs(
    executor: SlurmExecutor, work: Path
) -> None:
    bad = SlurmExecutor(executor.transport, str(work), SlurmOptions(partition="nowhere"))
    with pytest.raises(CommandError, match=r"(?i)partition"):
        bad.spawn(JobCommand(dir=str(work / "refused"), script="true"))
    with pytest.raises(InvalidArgument, match="%"):
        executor.spawn(JobCommand(dir=str(work / "100%"), script="true"))
    with pytest.raises(InvalidArgument, match="container"):
        executor.spawn(
            JobCommand(
                dir=str(work / "c"), script="true", container=Container(engine="docker", name="x")
            )
        )


def test_squeue_lines_are_parsed_and_garbage_skipped() -> None:
    found = parse_squeue(b"12|RUNNING|None\n13|PENDING|Resources\n12.batch|RUNNING|x\nnoise\n|\n")
    assert {k: str(v) for k, v in found.items()} == {12: "RUNNING", 13: "PENDING (Resources)"}


@pytest.fixture(scope="module")
def login(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """An sshd on loopback whose sessions find the cluster (`SetEnv SLURM_CONF`): a
    login node."""
    server = start_sshd(
        tmp_path_factory.mktemp("slurm-login"), extra_config=f"SetEnv SLURM_CONF={slurm.conf}"
    )
    try:
        yield server
    finally:
        server.stop()


def test_a_login_node_over_ssh_submits_follows_and_cancels(
    slurm: SlurmCluster, login: SshServer, work: Path
) -> None:
    ssh = ssh_executor(login, work)
    try:
        executor = SlurmExecutor(ssh.transport, str(work), SlurmOptions())
        run = work / "over ssh"
        job = executor.spawn(
            JobCommand(
                dir=str(run),
                script='printf "%s\\n" "$TOKEN" > seen; exec sleep 300',
                secrets={"TOKEN": SecretStr(SECRET)},
            )
        )
        wait_for((run / "seen").exists, 30)
        assert (run / "seen").read_text() == f"{SECRET}\n"
        assert executor.status(job) == JobStatus.RUNNING
        executor.cancel(job)
        assert executor.status(job) == JobStatus.CANCELLED
        assert _state(slurm, job) not in {"RUNNING", "COMPLETING"}
    finally:
        ssh.close()


def test_doctor_checks_the_commands_partition_containment_and_shared_workdir(
    executor: SlurmExecutor, work: Path
) -> None:
    checks = {c.name: c for c in executor.doctor().checks}
    assert checks["slurm"].status == "ok"
    assert "22." in checks["slurm"].found or "slurm" in checks["slurm"].found
    assert (checks["partition"].status, checks["partition"].found) == ("ok", "debug: up")
    # The test cluster tracks processes by their group: said, with what it leaves open.
    assert checks["containment"].status == "warn"
    assert "proctrack/pgid" in checks["containment"].found
    assert "setsid" in checks["containment"].breaks
    assert checks["shared-workdir"].status == "ok", checks["shared-workdir"]
    assert not list(work.glob(".runwarden-doctor.*"))
    bad = SlurmExecutor(executor.transport, str(work), SlurmOptions(partition="nowhere"))
    checks = {c.name: c for c in bad.doctor().checks}
    assert checks["partition"].status == "missing"
    assert checks["shared-workdir"].status == "missing"
    assert "refused" in checks["shared-workdir"].found


def test_a_job_whose_node_went_down_ended_with_slurms_word(
    slurm: SlurmCluster, executor: SlurmExecutor, work: Path
) -> None:
    # Last in the module: the node goes down and comes back; Slurm's word is beside
    # the run's end.
    run = work / "node-fail"
    job = executor.spawn(JobCommand(dir=str(run), script="exec sleep 300"))
    slurm.wait_state(str(job.slurm), {"RUNNING"})
    node = slurm.node
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=rw-test")
    try:
        slurm.wait_state(str(job.slurm), {"NODE_FAIL"})
        # Slurm says the job ended. Its end is in the run directory when the node's
        # slurmd got to SIGTERM it before the kill (exited 143), else nothing recorded it
        # (lost): both are seen under load, never running again.
        ended = {JobStatus.exited(143), JobStatus.LOST}
        assert executor.status(job) in ended
        [update] = executor.follow([FollowEntry(job, 0, 0)])
        assert update.status in ended
        assert update.scheduler is not None
        assert update.scheduler.startswith(f"Slurm job {job.slurm}: NODE_FAIL")
    finally:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
