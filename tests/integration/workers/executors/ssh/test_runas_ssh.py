"""An SSH target whose jobs run as a user of their own (`TargetConfig.run_as`), for real:
an `sshd` on loopback whose only login is the control user ([`WORKER_USER`]), with
exactly the sudoers line docs/security.md gives it for the jobs' user ([`JOB_USER`]).

Every script but the control ones runs as the jobs' user through `sudo -n`, from the
user's least environment; whether a job's leader runs is asked of the login user, so a
daemon the job leaves behind that kills every script of its user (found by their
command lines, as a hostile job would) cannot report the job ended or hold its status
up. Its cancel, which runs as the jobs' user, is what such a job can still fight
where the login gets no cgroup (it fails, as docs/security.md says).

A second server logs the control user in to a cgroup delegated to it (as systemd's
`Delegate=yes` does), the control user a member of the jobs' user's group: that login,
not root, contains the jobs in a cgroup per run they cannot leave, and its cancel ends
what fought the user's (docs/protocol.md, "Containment")."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import fakeredis
import pytest

from bench.harness.hostile import FIGHTER
from bench.harness.processes import hidden_processes, kill_processes_in
from bench.harness.sshd import SshServer, running_sshd
from bench.harness.users import (
    JOB_USER,
    WORKER_USER,
    ensure_group_member,
    ensure_login_user,
    ensure_sudo_rule,
    ensure_user,
    job_python,
    shared_dir,
)
from schemas import JobCommand, JobId, JobStatus, Settings
from schemas.doctor import DoctorReport
from schemas.protocol import EXIT_FILE, MARK_ENV, new_mark
from store import RunStore
from workers.cgroups import CGROUP_PARENT, hierarchy_mount
from workers.context import Context
from workers.doctor import doctor
from workers.executors import (
    CommandError,
    ExecError,
    FollowEntry,
    InvalidArgument,
    SshExecutor,
    shell,
)
from workers.executors.ssh import connection_pool

from .....conftest import process_alive, put_signed_target, wait_for

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
    # sshd put the login in a cgroup of root's: for the jobs of another user as for
    # its own, the reason and where the setup is told.
    for asked in (executor, _executor(server, workdir, run_as=None)):
        base, why = asked.cgroup_base()
        assert base is None
        assert "is not root and its cgroup" in why
        assert "not delegated to it (give it one: docs/security.md, On an SSH target)" in why


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


def _doctor(server: SshServer, workdir: Path, tmp_path: Path) -> DoctorReport:
    """The doctor's report of a target of `server` whose jobs run as JOB_USER."""
    store = RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    ctx = Context(store, Settings(state_dir=tmp_path / "state"), lambda *_: None, "w")
    ssh = {"destination": server.destination, "identity": str(server.client_key),
           "known_hosts": str(server.known_hosts)}  # fmt: skip
    config = {"name": "far", "kind": "ssh", "workdir": str(workdir), "ssh": ssh, "run_as": JOB_USER}
    put_signed_target(store, ctx.settings, config)
    try:
        return doctor(ctx, "far", datetime.now(UTC))
    finally:
        connection_pool().close_all()


def test_doctor_says_whose_the_jobs_are_and_finds_the_target_usable(
    place: tuple[SshServer, Path], tmp_path: Path
) -> None:
    report = _doctor(*place, tmp_path)
    checks = {c.name: c for c in report.checks}
    # Usable, but not contained: why, and where the setup is told.
    assert checks["cgroup"].status == "warn"
    assert checks["cgroup"].found.startswith("none: the login user is not root and its cgroup")
    assert checks["cgroup"].found.endswith("(give it one: docs/security.md, On an SSH target)")
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


@pytest.fixture(scope="module")
def delegated() -> Iterator[tuple[SshServer, Path]]:
    """A server whose login, the control user, runs in a cgroup delegated to it, the
    control user a member of the jobs' user's group (docs/security.md, On an SSH
    target); a workdir of the jobs' user. Its teardown removes the cgroup."""
    ensure_login_user(WORKER_USER)
    job = ensure_user(JOB_USER)
    ensure_sudo_rule(WORKER_USER, JOB_USER)
    ensure_group_member(WORKER_USER, JOB_USER)
    with shared_dir("rw-ssh-delegated-") as base:
        cgroup = None
        try:
            with running_sshd(base, login=WORKER_USER, delegate=True) as server:
                cgroup = server.cgroup
                assert cgroup is not None
                workdir = base / "runs"
                workdir.mkdir()
                os.chown(workdir, job.pw_uid, job.pw_gid)
                yield server, workdir
            assert not cgroup.exists()  # the server's stop removed it
        finally:
            kill_processes_in(base)


# Out of the job's session and environment, and deaf to SIGTERM; tries to move itself
# into the hierarchy's root and into the login's delegated cgroup, and says how each
# went; its argument names the run directory (`hidden_processes` finds it by /proc).
ESCAPE = """PATH=/usr/bin:/bin
setsid env -i /bin/sh -c 'trap "" TERM
for rw_to in "$1" "$2"; do
  if { echo $$ > "$rw_to/cgroup.procs"; } 2>/dev/null; then echo out; else echo in; fi
done > "$0/escaped.tmp" && mv "$0/escaped.tmp" "$0/escaped"
while :; do sleep 1; done' "$(pwd)" "$ROOT" "$BASE" </dev/null >/dev/null 2>&1 &
"""


def _delegated_run(server: SshServer, workdir: Path, script: str) -> tuple[Path, JobCommand]:
    assert server.cgroup is not None
    cgroup = server.cgroup / CGROUP_PARENT / new_mark()
    root = hierarchy_mount()
    assert root is not None
    command = JobCommand(
        dir=str(workdir / cgroup.name),
        script=script,
        env={MARK_ENV: cgroup.name, "ROOT": str(root), "BASE": str(server.cgroup)},
        cgroup=str(cgroup),
    )
    return cgroup, command


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _the_hidden(run: Path) -> int:
    """ESCAPE's daemon of the run directory `run`, by /proc: its script and its empty
    environment, from a reading that found exactly one (its loop forks a shell for
    each `sleep`, a moment before that one execs)."""

    def one() -> int | None:
        found = []
        for pid in hidden_processes(str(run)):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if argv[1:2] == [b"-c"] and argv[2].startswith(b'trap "" TERM') and not environ:
                found.append(pid)
        return found[0] if len(found) == 1 else None

    found = wait_for(one)
    assert isinstance(found, int)
    return found


def _kill_cgroup(cgroup: Path) -> None:
    """What a failure left in `cgroup`, killed (the server's stop removes it)."""
    with contextlib.suppress(OSError):
        (cgroup / "cgroup.kill").write_text("1")


def test_a_login_that_is_not_root_contains_its_run_as_jobs_in_its_delegated_cgroup(
    delegated: tuple[SshServer, Path],
) -> None:
    """The login, not root, in a cgroup delegated to it and a member of the jobs'
    user's group: the run's cgroup is under the login's, its `cgroup.procs` and
    `cgroup.kill` the login's, group-writable by the user's group alone; the job's
    hidden `setsid env -i` daemon, of the jobs' user, is held in it and cannot move
    itself into the hierarchy's root nor into the login's cgroup; the user's cancel
    ends it (deaf to SIGTERM, it waits for the cancel's `cgroup.kill` after the 10 s
    grace: the user's write through the group's bit) and the login removes the
    emptied cgroup."""
    server, workdir = delegated
    job_user = pwd.getpwnam(JOB_USER)
    login = pwd.getpwnam(WORKER_USER)
    executor = _executor(server, workdir)
    cgroup, command = _delegated_run(server, workdir, ESCAPE + "while :; do sleep 1; done\n")
    run = Path(command.dir)
    try:
        assert executor.cgroup_base() == (str(server.cgroup), "")
        assert executor.claim(command.dir, "this test")
        job = executor.spawn(command)
        assert job.cgroup == str(cgroup)
        wait_for((run / "escaped").exists, timeout_s=20)
        assert (run / "escaped").read_text() == "in\nin\n"
        hidden = _the_hidden(run)
        assert os.stat(f"/proc/{hidden}").st_uid == job_user.pw_uid
        assert hidden in _procs(cgroup)
        assert job.pid in _procs(cgroup)
        assert cgroup.stat().st_uid == login.pw_uid  # made by the login, not root
        for name in ("cgroup.procs", "cgroup.kill"):
            info = (cgroup / name).stat()
            assert (info.st_uid, info.st_gid) == (login.pw_uid, job_user.pw_gid)
            assert info.st_mode & stat.S_IWGRP
            assert not info.st_mode & stat.S_IWOTH
        executor.cancel(job)
        assert not process_alive(hidden)
        assert hidden_processes(str(run)) == []
        assert not cgroup.exists()
        assert executor.status(job) is JobStatus.CANCELLED
    finally:
        kill_processes_in(run)
        _kill_cgroup(cgroup)
        connection_pool().close_all()


def test_a_run_as_job_that_kills_its_cancel_is_cancelled_by_the_login_s_cgroup_kill(
    delegated: tuple[SshServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delegated login, not root: the job's daemon kills every script of the jobs'
    user, the cancel's too; the login kills the run's cgroup (its own `cgroup.kill`,
    the daemon with it) and the user's cancel runs again and records it."""
    server, workdir = delegated
    monkeypatch.setattr(shell, "CANCEL_DEADLINE_S", 2.0)
    scope = workdir / f"fight-{new_mark()[:8]}"
    scope.mkdir()
    (scope / "fighter.py").write_text(FIGHTER)
    os.chmod(scope / "fighter.py", 0o644)
    script = (
        f"setsid env -i {job_python()} {scope / 'fighter.py'} SIGKILL {scope}"
        " </dev/null >/dev/null 2>&1 &\n"
        "trap '' TERM\nexec sleep 600\n"
    )
    cgroup, command = _delegated_run(server, scope, script)
    job_user = pwd.getpwnam(JOB_USER)
    os.chown(scope, job_user.pw_uid, job_user.pw_gid)
    executor = _executor(server, scope)
    try:
        assert executor.claim(command.dir, "this test")
        job = executor.spawn(command)
        wait_for((Path(command.dir) / "armed").exists, timeout_s=20)
        fighter = hidden_processes(str(scope / "fighter.py"))
        assert fighter
        assert all(p in _procs(cgroup) for p in fighter)
        executor.cancel(job)
        assert _procs(cgroup) == []
        assert hidden_processes(str(scope)) == []
        assert not cgroup.exists()
        assert executor.status(job) is JobStatus.CANCELLED
    finally:
        kill_processes_in(scope)
        _kill_cgroup(cgroup)
        connection_pool().close_all()


def test_doctor_finds_the_runs_of_a_delegated_login_contained(
    delegated: tuple[SshServer, Path], tmp_path: Path
) -> None:
    server, workdir = delegated
    report = _doctor(server, workdir, tmp_path)
    checks = {c.name: c for c in report.checks}
    assert (checks["cgroup"].status, checks["cgroup"].found) == (
        "ok",
        f"a cgroup v2 per run under {server.cgroup}/{CGROUP_PARENT}, made by the login user",
    )
    assert report.exit_code == 0


def test_a_delegated_login_says_what_it_lacks_to_contain_another_user_s_jobs(
    delegated: tuple[SshServer, Path],
) -> None:
    """The login's cgroup is delegated, but it may not give the jobs' user the run's
    files: not a member of the user's group (`nobody`'s), or the user's group is the
    login's own (its other members could end the runs): no cgroup, the reason and
    its remedy."""
    server, workdir = delegated
    try:
        base, why = _executor(server, workdir, run_as="nobody").cgroup_base()
        assert base is None
        nobody_group = grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name
        assert why == (
            f"the login user {WORKER_USER} is not root and not a member of nobody's group "
            f"{nobody_group}: it cannot give nobody its run's cgroup (on the target, as "
            f"root: usermod -a -G {nobody_group} {WORKER_USER}; docs/security.md, On an "
            "SSH target)"
        )
        base, why = _executor(server, workdir, run_as=WORKER_USER).cgroup_base()
        assert base is None
        assert f"{WORKER_USER}'s group {WORKER_USER} is the login user's own primary group" in why
        # Its own jobs: the delegated cgroup is all it needs.
        assert _executor(server, workdir, run_as=None).cgroup_base() == (str(server.cgroup), "")
    finally:
        connection_pool().close_all()
