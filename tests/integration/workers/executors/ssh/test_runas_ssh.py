"""An SSH target whose jobs run as a user of their own (`TargetConfig.run_as`), for real:
an `sshd` on loopback whose only login is the control user ([`WORKER_USER`]), with
exactly the sudoers line docs/security.md gives it for the jobs' user ([`JOB_USER`]).

Every script but the control ones runs as the jobs' user through `sudo -n`, from the
user's least environment; whether a job's leader runs is asked of the login user, so a
daemon the job leaves behind that kills every script of its user (found by their
command lines, as a hostile job would) cannot report the job ended or hold its status
up. Its cancel, which runs as the jobs' user, is what such a job can still fight there
(no cgroup over SSH): it fails, as docs/security.md says."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import fakeredis
import pytest

from bench.harness.hostile import FIGHTER
from bench.harness.processes import kill_processes_in
from bench.harness.sshd import SshServer, running_sshd
from bench.harness.users import (
    JOB_USER,
    WORKER_USER,
    ensure_login_user,
    ensure_sudo_rule,
    ensure_user,
    job_python,
    shared_dir,
)
from schemas import JobCommand, JobId, JobStatus, Settings
from schemas.protocol import EXIT_FILE
from store import RunStore
from workers.context import Context
from workers.doctor import doctor
from workers.executors import CommandError, ExecError, FollowEntry, InvalidArgument, SshExecutor
from workers.executors.ssh import connection_pool

from .....conftest import put_signed_target, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def place() -> Iterator[tuple[SshServer, Path]]:
    """The server (login: the control user) and a workdir of the jobs' user."""
    ensure_login_user(WORKER_USER)
    job = ensure_user(JOB_USER)
    ensure_sudo_rule(WORKER_USER, JOB_USER)
    with shared_dir("rw-ssh-runas-") as base:
        try:
            with running_sshd(base, login=WORKER_USER) as server:
                workdir = base / "runs"
                workdir.mkdir()
                os.chown(workdir, job.pw_uid, job.pw_gid)
                yield server, workdir
        finally:
            # What a test's job left behind ends with the module: only this module's,
            # never every process of the jobs' user (other tests run as that user
            # meanwhile). After the server's own stop: killing its supervisor first
            # (its arguments are under `base`) left its sshd listening for good.
            kill_processes_in(base)


def _executor(server: SshServer, workdir: Path, run_as: str | None = JOB_USER) -> SshExecutor:
    return SshExecutor.connect(
        server.destination,
        str(workdir),
        identity=server.client_key,
        known_hosts=server.known_hosts,
        run_as=run_as,
    )


@pytest.fixture
def executor(place: tuple[SshServer, Path]) -> Iterator[SshExecutor]:
    server, workdir = place
    yield _executor(server, workdir)
    connection_pool().close_all()


def test_jobs_run_as_their_user_from_its_least_environment(
    executor: SshExecutor, place: tuple[SshServer, Path]
) -> None:
    _, workdir = place
    run = workdir / "who"
    command = JobCommand(
        dir=str(run),
        script="id -u > uid; env > env; exit 7",
        env={"ASKED": "a b"},
        secrets={"HF_TOKEN": "s3cret value"},
    )
    assert executor.claim(command.dir, "this test")
    job = executor.spawn(command)
    wait_for((run / EXIT_FILE).exists, timeout_s=20)
    # Running while its wrapper, which wrote `exit_code` last, has not ended yet.
    wait_for(lambda: executor.status(job) == JobStatus.exited(7))
    user = pwd.getpwnam(JOB_USER)
    assert (run / "uid").read_text() == f"{user.pw_uid}\n"
    env = dict(line.split("=", 1) for line in (run / "env").read_text().splitlines() if "=" in line)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (user.pw_dir, JOB_USER, JOB_USER)
    assert env["ASKED"] == "a b"
    assert env["HF_TOKEN"] == "s3cret value"  # through sudo, on the launcher's stdin
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    # Nothing of the login's session or of sudo's reaches the job.
    assert not [name for name in env if name.startswith(("SSH_", "SUDO_"))]
    assert os.stat(run).st_uid == user.pw_uid  # the claim made it as the jobs' user


def test_a_job_that_kills_its_user_s_scripts_cannot_end_or_stall_its_status(
    executor: SshExecutor, place: tuple[SshServer, Path]
) -> None:
    _, workdir = place
    run = workdir / "fight"
    run.mkdir()
    (workdir / "fighter.py").write_text(FIGHTER)
    os.chmod(workdir / "fighter.py", 0o644)
    command = JobCommand(
        dir=str(run),
        script=(
            f"setsid env -i {job_python()} {workdir / 'fighter.py'} SIGKILL {workdir}"
            " </dev/null >/dev/null 2>&1 &\n"
            # Deaf to SIGTERM: the cancel then waits 10 s for its SIGKILL, in which
            # the daemon, looking 50 times a second, surely finds it (a group that
            # ends at once may let a cancel finish first).
            "trap '' TERM\nexec sleep 600\n"
        ),
    )
    user = pwd.getpwnam(JOB_USER)
    os.chown(run, user.pw_uid, user.pw_gid)
    assert executor.claim(command.dir, "this test")
    job = executor.spawn(command)
    try:
        wait_for((run / "armed").exists, timeout_s=20)
        # Asked of the login user: a script the daemon kills would say otherwise.
        for _ in range(30):
            assert executor.statuses([job, job]) == [JobStatus.RUNNING] * 2
        # So is the follow of every run of the target, and the status of an ended
        # job: the daemon kills the scripts of its user only.
        wait_for((run / "job.log").exists)
        ended = workdir / "ended"
        _write_as_job(ended, {"exit_code": "4\n", "job.log": "done\n"})
        dead = subprocess.Popen(["true"])
        dead.wait()
        gone = JobId(dir=str(ended), pid=dead.pid, start=1)
        for _ in range(10):
            updates = executor.follow([FollowEntry(job, 0, 0), FollowEntry(gone, 0, 0)])
            assert [u.status for u in updates] == [JobStatus.RUNNING, JobStatus.exited(4)]
            assert updates[1].log == b"done\n"
            assert executor.statuses([gone]) == [JobStatus.exited(4)]
        # The cancel runs as the jobs' user, whom the daemon fights: it fails.
        with pytest.raises(ExecError):
            executor.cancel(job)
    finally:
        kill_processes_in(run)  # the job and the daemon (its argument is under the workdir)
        kill_processes_in(workdir / "fighter.py")
    wait_for(lambda: not Path(f"/proc/{job.pid}").exists())


def _write_as_job(run: Path, files: dict[str, str]) -> None:
    """A run directory of the jobs' user, as its umask leaves one (0755, files 0644)."""
    user = pwd.getpwnam(JOB_USER)
    run.mkdir()
    os.chown(run, user.pw_uid, user.pw_gid)
    for name, text in files.items():
        (run / name).write_text(text)
        os.chown(run / name, user.pw_uid, user.pw_gid)


def test_a_login_that_is_not_root_gets_no_cgroup_and_says_why(
    executor: SshExecutor, place: tuple[SshServer, Path]
) -> None:
    server, workdir = place
    assert executor.cgroup_base() == (
        None,
        "the login user is not root: it cannot put the jobs of another user in a cgroup",
    )
    # Its own jobs: the login is not root, and sshd put it in a cgroup of root's.
    base, why = _executor(server, workdir, run_as=None).cgroup_base()
    assert base is None
    assert "is not root and its cgroup" in why
    assert "not delegated to it" in why


def test_a_login_sudo_refuses_is_one_clear_error(place: tuple[SshServer, Path]) -> None:
    server, workdir = place
    # `nobody` exists but the control user has no sudoers line for it.
    executor = _executor(server, workdir, run_as="nobody")
    try:
        with pytest.raises(CommandError) as caught:
            executor.claim(str(workdir / "never"), "this test")
        text = str(caught.value)
        assert f"`{WORKER_USER} ALL=(nobody) NOPASSWD: ALL`" in text
        assert not (workdir / "never").exists()
    finally:
        connection_pool().close_all()


@pytest.mark.parametrize("user", [WORKER_USER, "no-such-user-here"])
def test_jobs_never_run_as_the_login_or_an_unknown_user(
    place: tuple[SshServer, Path], user: str
) -> None:
    server, workdir = place
    executor = _executor(server, workdir, run_as=user)
    try:
        with pytest.raises(CommandError, match=f"run as {user} failed") as refused:
            executor.claim(str(workdir / "never"), "this test")
        # Not sudo's refusal: no sudoers line would help.
        assert "sudoers" not in str(refused.value)
        assert "the login user" in str(refused.value) or "no user" in str(refused.value)
    finally:
        connection_pool().close_all()


def test_doctor_says_whose_the_jobs_are_and_finds_the_target_usable(
    place: tuple[SshServer, Path], tmp_path: Path
) -> None:
    server, workdir = place
    store = RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    ctx = Context(store, Settings(state_dir=tmp_path / "state"), lambda *_: None, "w")
    ssh = {"destination": server.destination, "identity": str(server.client_key),
           "known_hosts": str(server.known_hosts)}  # fmt: skip
    config = {"name": "far", "kind": "ssh", "workdir": str(workdir), "ssh": ssh, "run_as": JOB_USER}
    put_signed_target(store, ctx.settings, config)
    try:
        report = doctor(ctx, "far", datetime.now(UTC))
    finally:
        connection_pool().close_all()
    checks = {c.name: c for c in report.checks}
    assert checks["job-user"].status == "ok"
    assert (
        checks["job-user"].found
        == f"jobs run as {JOB_USER}, not as the login user, through sudo -n"
    )
    assert not report.missing, [(c.name, c.found) for c in report.missing]
    assert report.exit_code == 0


def test_an_executor_refuses_root_and_what_is_no_user_name() -> None:
    for name in ("bad user", "root"):
        with pytest.raises(InvalidArgument):
            SshExecutor.connect("u@127.0.0.1", "/w", run_as=name)
