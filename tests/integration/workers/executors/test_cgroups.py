"""A run's cgroup (cgroup v2, `workers.cgroups`) for real, as root on this machine's
hierarchy: the launcher enters it before the job starts, so a child that leaves the
job's session and clears its environment (`setsid env -i`: out of reach of the group
and of the mark) is still the run's; a cancel ends it (SIGTERM, `cgroup.kill` after
the grace for one that ignores it), and so does the end of a job that left it behind
(`release`); the emptied cgroup is removed. Local and shell executors, and a target
whose jobs run as another user (the worker makes the cgroup and enters it before the
change of user; the user cannot take a process out). An SSH target with a root login
(or one whose cgroup is delegated to it) gets one too, made by its launcher; for one
whose jobs run as another user the login makes it and enters it before the change of
user (`workers.cgroups.containment`): a root login here, a delegated login that is not
root in ssh/test_runas_ssh.py."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.hostile import FIGHTER
from bench.harness.processes import kill_processes_in
from bench.harness.sshd import SshServer
from bench.harness.users import (
    JOB_USER,
    WORKER_USER,
    as_user,
    ensure_user,
    job_python,
    shared_dir,
)
from schemas import JobCommand, JobStatus, RunRecord, Settings, TargetConfig
from schemas.job import parse_job_end
from schemas.protocol import END_FILE, MARK_ENV, new_mark
from workers import cgroups
from workers.cgroups import (
    CGROUP_PARENT,
    EMPTY_AGE_S,
    containment,
    hierarchy,
    own_cgroup,
    remove_empty,
    run_cgroup,
)
from workers.executors import (
    CommandError,
    Executor,
    FollowEntry,
    LocalExecutor,
    LocalTransport,
    RunAsExecutor,
    ScriptExecutor,
    SshExecutor,
    runas,
    shell,
)
from workers.executors.runas import RunAsTransport, job_user
from workers.executors.scripts import status as status_scripts

from ....conftest import Target, process_alive, wait_for

pytestmark = pytest.mark.slow

# A child in a session of its own with an empty environment that ignores SIGTERM,
# then the job's own loop (or its end).
HIDDEN = """PATH=/usr/bin:/bin
setsid env -i /bin/sh -c 'trap "" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
"""


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A fresh run cgroup path under this machine's hierarchy (not made yet); what a
    failure leaves in it is killed and it is removed."""
    root = hierarchy()
    assert root is not None, "no writable cgroup v2 hierarchy: these tests need root"
    path = root / CGROUP_PARENT / new_mark()
    yield path
    _remove(path)


def _remove(path: Path) -> None:
    """Kills what a failure left in the cgroup `path` and removes it, when it is there."""
    if path.is_dir():
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")
        wait_for(lambda: _procs(path) == [], timeout_s=5)
        with contextlib.suppress(OSError):
            path.rmdir()


def _fighting(base: Path, signal_name: str, cgroup: Path) -> JobCommand:
    """The job `runs/run` under `base`, in `cgroup`: it leaves `base`'s `fighter.py`
    (FIGHTER) sending `signal_name` to every script of its user that names `base`, and
    ignores SIGTERM itself, so the user's cancel waits for its SIGKILL, time in which
    the daemon surely finds it (a job that ends at once may let a cancel finish first)."""
    return JobCommand(
        dir=str(base / "runs" / "run"),
        script=(
            f"setsid env -i {job_python()} {base / 'fighter.py'} {signal_name} {base}"
            " </dev/null >/dev/null 2>&1 &\n"
            "trap '' TERM\nexec sleep 600\n"
        ),
        env={MARK_ENV: cgroup.name},
        cgroup=str(cgroup),
    )


def _procs(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _spawn(target: Target, cgroup: Path, script: str) -> tuple[Executor, JobCommand]:
    command = JobCommand(
        dir=target.run_dir(cgroup.name),
        script=script,
        env={MARK_ENV: cgroup.name},
        cgroup=str(cgroup),
    )
    return target.executor, command


def _hidden(cgroup: Path) -> list[int]:
    """The `env -i` shells of `cgroup`: HIDDEN's (or ESCAPE's) daemon, by its script
    (`sh -c 'trap "" TERM...'`) and its empty environment; not its `sleep`s once they
    exec'd. By the command line, never by an empty environment alone: a process that
    has just ended reads as an empty environment too (a `sleep` of the job's own loop
    was once taken for the daemon)."""
    found = []
    for pid in _procs(cgroup):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        daemon = len(argv) > 2 and argv[1] == b"-c" and argv[2].startswith(b'trap "" TERM')
        if daemon and environ == b"":
            found.append(pid)
    return found


# One executor: both run the same cancel script, and its grace costs 10 s.
def _the_hidden(cgroup: Path) -> int:
    """The one hidden shell of `cgroup`, from a reading that found exactly one: its
    loop forks a shell for each `sleep`, a moment before that one execs."""

    def one() -> int | None:
        hidden = _hidden(cgroup)
        return hidden[0] if len(hidden) == 1 else None

    found = wait_for(one)
    assert isinstance(found, int)
    return found


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_cancel_ends_a_child_that_left_the_session_and_cleared_its_environment(
    target: Target, cgroup: Path
) -> None:
    executor, command = _spawn(target, cgroup, HIDDEN + "while :; do sleep 1; done\n")
    job = executor.spawn(command)
    assert job.cgroup == str(cgroup)
    hidden = _the_hidden(cgroup)
    assert job.pid in _procs(cgroup)
    assert os.getsid(hidden) != job.pid  # out of the job's session, and of its mark

    started = time.monotonic()
    executor.cancel(job)
    took = time.monotonic() - started
    assert executor.status(job) is JobStatus.CANCELLED
    assert not process_alive(hidden)
    assert not cgroup.exists()  # emptied and removed
    # The hidden child ignores SIGTERM: `cgroup.kill` after the 10 s grace.
    assert 9.5 <= took < 25, took


@pytest.mark.parametrize("target", ["local", "shell"], indirect=True)
def test_the_wrapper_s_sweep_finds_in_the_cgroup_what_cleared_its_environment(
    target: Target, cgroup: Path
) -> None:
    """What left the session and cleared its environment (no group, no mark) is still
    in the run's cgroup, where the wrapper's end sweep finds it: SIGTERM, and the run's
    end says it (`leftovers`) once it is gone."""
    soft = "setsid env -i /bin/sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &\n"
    executor, command = _spawn(target, cgroup, f"PATH=/usr/bin:/bin\n{soft}sleep 0.5\nexit 3\n")
    job = executor.spawn(command)
    assert wait_for(lambda: executor.status(job).is_finished and executor.status(job), 20) == (
        JobStatus.exited(3)
    )
    end = parse_job_end((Path(command.dir) / END_FILE).read_bytes())
    assert end is not None
    assert end.leftovers >= 1
    assert end.survived == 0
    assert _procs(cgroup) == []  # ended before `exit_code` was written


def test_with_wait_for_all_the_run_waits_for_what_only_its_cgroup_holds(
    cgroup: Path, tmp_path: Path
) -> None:
    """`--wait-for-all`: a run lasts while its cgroup holds a process of it, one that
    cleared its environment and left the session too; it ends when that one does."""
    executor = LocalExecutor(tmp_path)
    command = JobCommand(
        dir=str(tmp_path / "run"), script=HIDDEN + "exit 3\n", env={MARK_ENV: cgroup.name},
        cgroup=str(cgroup), wait_for_all=True,
    )  # fmt: skip
    job = executor.spawn(command)
    hidden = _the_hidden(cgroup)
    time.sleep(1.5)  # more than a look of the wrapper
    assert executor.status(job) is JobStatus.RUNNING
    os.kill(hidden, signal.SIGKILL)
    assert wait_for(lambda: executor.status(job).is_finished and executor.status(job), 20) == (
        JobStatus.exited(3)
    )
    end = parse_job_end((Path(command.dir) / END_FILE).read_bytes())
    assert end is not None
    assert end.waited >= 1


@pytest.mark.parametrize("target", ["local", "shell"], indirect=True)
def test_release_ends_what_a_killed_wrapper_left_in_the_cgroup(
    target: Target, cgroup: Path
) -> None:
    """A job whose wrapper is killed from outside (no sweep: its end reads `lost`)
    leaves a child that cleared its environment and ignores SIGTERM: the release that
    comes before its end is recorded ends it, and the emptied cgroup goes."""
    executor, command = _spawn(target, cgroup, HIDDEN + "exec sleep 600\n")
    job = executor.spawn(command)
    hidden = _the_hidden(cgroup)
    os.killpg(job.pid, signal.SIGKILL)
    assert wait_for(lambda: executor.status(job).is_finished and executor.status(job)) == (
        JobStatus.LOST
    )
    assert process_alive(hidden)
    executor.release(job)
    assert not process_alive(hidden)
    assert not cgroup.exists()
    executor.release(job)  # a cgroup that is gone is no error


def test_a_target_says_whether_its_runs_are_contained() -> None:
    settings = Settings()
    local = TargetConfig(name="l", kind="local", workdir="/w")
    assert containment(local, settings) is None  # root, with this machine's hierarchy
    assert "turned off" in str(containment(local, settings.model_copy(update={"cgroups": False})))
    assert containment(local.model_copy(update={"run_as": "nobody"}), settings) is None
    ssh = {"destination": "u@h", "identity": "/k", "known_hosts": "/kh"}
    over_ssh = TargetConfig(name="s", kind="ssh", workdir="/w", ssh=ssh)
    assert "SSH" in str(containment(over_ssh, settings))


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_an_ssh_target_with_a_root_login_contains_its_runs(target: Target) -> None:
    """The target says where its runs' cgroups go (`SshExecutor.cgroup_base`: its
    hierarchy for a root login, asked once); the cgroup `run_cgroup` gives a run is
    made by the launcher over SSH and holds the hidden daemon, which the cancel ends."""
    executor = target.executor
    assert isinstance(executor, SshExecutor)
    assert executor.cgroup_base() == (str(hierarchy()), "")
    ssh = {"destination": "u@h", "identity": "/k", "known_hosts": "/kh"}
    config = TargetConfig(name="s", kind="ssh", workdir="/w", ssh=ssh)
    assert containment(config, Settings(), executor) is None
    assert containment(config, Settings()) is not None  # no executor to ask
    run = RunRecord.model_construct(mark=new_mark())  # run_cgroup reads its mark
    path = run_cgroup(config, run, Settings(), executor)
    assert path == f"{hierarchy()}/{CGROUP_PARENT}/{run.mark}"
    cgroup = Path(path)
    try:
        job = executor.spawn(
            JobCommand(
                dir=target.run_dir(),
                script=HIDDEN + "while :; do sleep 1; done\n",
                env={MARK_ENV: cgroup.name},
                cgroup=path,
            )
        )
        hidden = _the_hidden(cgroup)
        assert job.pid in _procs(cgroup)
        # Beside it, what an earlier run's end cut short left: an empty cgroup a minute
        # old, which goes with this run's end, and one just made, which stays.
        old, young = (cgroup.parent / new_mark() for _ in range(2))
        old.mkdir()
        young.mkdir()
        os.utime(old, (time.time() - 120, time.time() - 120))
        executor.cancel(job)
        assert not process_alive(hidden)
        assert not cgroup.exists()
        assert not old.exists()
        assert young.exists()
        young.rmdir()
    finally:
        _remove(cgroup)


def test_an_ssh_target_whose_jobs_run_as_another_user_contains_them_with_a_root_login(
    sshd: SshServer,
) -> None:
    """A root login, jobs run as JOB_USER: the login makes the run's cgroup, gives the
    user its `cgroup.procs` and `cgroup.kill` and enters it before sudo, so the job's
    hidden daemon is held and cannot move out (ESCAPE tries: refused); the user's
    cancel ends it and the login removes the emptied cgroup."""
    ensure_user(JOB_USER)
    user = pwd.getpwnam(JOB_USER)
    with shared_dir() as work:
        os.chown(work, user.pw_uid, user.pw_gid)
        executor = SshExecutor.connect(
            sshd.destination,
            str(work),
            identity=sshd.client_key,
            known_hosts=sshd.known_hosts,
            run_as=JOB_USER,
        )
        assert executor.cgroup_base() == (str(hierarchy()), "")
        cgroup = hierarchy() / CGROUP_PARENT / new_mark()  # type: ignore[operator]
        command = JobCommand(
            dir=str(work / "run"),
            script=ESCAPE + "while :; do sleep 1; done\n",
            env={MARK_ENV: cgroup.name, "ROOT": str(hierarchy())},
            cgroup=str(cgroup),
        )
        try:
            assert executor.claim(command.dir, "this test")
            job = executor.spawn(command)
            hidden = _the_hidden(cgroup)
            assert job.pid in _procs(cgroup)
            assert Path(f"/proc/{hidden}").stat().st_uid == user.pw_uid
            wait_for((work / "run" / "escaped").exists)
            assert (work / "run" / "escaped").read_text() == "in\n"
            executor.cancel(job)
            assert not process_alive(hidden)
            assert not cgroup.exists()
            assert executor.status(job) is JobStatus.CANCELLED
        finally:
            kill_processes_in(work)
            _remove(cgroup)
            executor.close()


def test_an_ssh_run_as_job_that_kills_its_cancel_is_cancelled_by_the_root_login(
    sshd: SshServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root login, jobs as JOB_USER: the job's daemon kills every script of its user,
    the cancel's too; the login, root, kills the run's cgroup (the daemon with it) and
    the user's cancel runs again and records it."""
    ensure_user(JOB_USER)
    user = pwd.getpwnam(JOB_USER)
    monkeypatch.setattr(shell, "CANCEL_DEADLINE_S", 2.0)
    with shared_dir() as work:
        os.chown(work, user.pw_uid, user.pw_gid)
        (work / "fighter.py").write_text(FIGHTER)
        executor = SshExecutor.connect(
            sshd.destination,
            str(work / "runs"),
            identity=sshd.client_key,
            known_hosts=sshd.known_hosts,
            run_as=JOB_USER,
        )
        cgroup = hierarchy() / CGROUP_PARENT / new_mark()  # type: ignore[operator]
        command = _fighting(work, "SIGKILL", cgroup)
        try:
            (work / "runs").mkdir()
            os.chown(work / "runs", user.pw_uid, user.pw_gid)
            assert executor.claim(command.dir, "this test")
            job = executor.spawn(command)
            wait_for((work / "runs" / "run" / "armed").exists)
            executor.cancel(job)
            assert _procs(cgroup) == []
            assert not cgroup.exists()
            assert executor.status(job) is JobStatus.CANCELLED
        finally:
            kill_processes_in(work)
            _remove(cgroup)
            executor.close()


def test_a_worker_that_is_not_root_says_what_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    local = TargetConfig(name="l", kind="local", workdir="/w")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cgroups, "delegated", lambda: None)
    assert "not delegated" in str(containment(local, settings))
    assert cgroups.cgroup_base() is None
    monkeypatch.setattr(cgroups, "delegated", lambda: Path("/sys/fs/cgroup/svc"))
    assert containment(local, settings) is None
    assert cgroups.cgroup_base() == Path("/sys/fs/cgroup/svc")
    as_another = local.model_copy(update={"run_as": "nobody"})
    assert "another user" in str(containment(as_another, settings))
    # The cgroup a process is in, from /proc/<pid>/cgroup (a hybrid host has v1 lines).
    mount = Path("/sys/fs/cgroup/unified")
    assert own_cgroup(mount, "1:name=systemd:/x\n0::/a/b.scope\n") == mount / "a" / "b.scope"
    assert own_cgroup(mount, "0::/\n") == mount
    assert own_cgroup(mount, "0::/a/../b\n") is None
    assert own_cgroup(mount, "1:cpu:/a\n") is None


# Out of the job's session and environment, and deaf to SIGTERM, as HIDDEN; also
# tries to leave the run's cgroup for the hierarchy's root (refused: a user may not
# move a process between cgroups) and says whether it could.
ESCAPE = """PATH=/usr/bin:/bin
setsid env -i /bin/sh -c 'trap "" TERM
if { echo $$ > "$0/cgroup.procs"; } 2>/dev/null; then echo out > escaped; else echo in > escaped; fi
while :; do sleep 1; done' "$ROOT" </dev/null >/dev/null 2>&1 &
"""


def test_a_run_as_job_is_contained_and_what_it_leaves_is_ended_by_the_user_s_release(
    cgroup: Path,
) -> None:
    """A target whose jobs run as another user: every process of the job is in the
    run's cgroup and the user's; a child that left the session, cleared its
    environment and ignores SIGTERM cannot move itself out of the cgroup; once the job
    ended without its wrapper's sweep (killed from outside), the user's release ends
    that child (`cgroup.kill`, the file given to the
    user) and the cgroup is empty (the worker's `remove_empty` removes it later: the
    user may not)."""
    user = ensure_user(JOB_USER)
    with shared_dir() as base:
        executor = RunAsExecutor(base / "runs", JOB_USER)
        root = cgroup.parent.parent
        command = JobCommand(
            dir=str(base / "runs" / "run"),
            script=ESCAPE + "exec sleep 600\n",
            env={MARK_ENV: cgroup.name, "ROOT": str(root)},
            cgroup=str(cgroup),
        )
        assert executor.claim(command.dir, "this test")
        job = executor.spawn(command)
        assert job.cgroup == str(cgroup)
        run = Path(command.dir)
        hidden = _the_hidden(cgroup)
        wait_for((run / "escaped").exists)
        # Its wrapper killed from outside: no sweep of its own finds the child.
        os.killpg(job.pid, signal.SIGKILL)
        wait_for(lambda: executor.status(job) == JobStatus.LOST)
        assert (run / "escaped").read_text() == "in\n"
        assert all(os.stat(f"/proc/{pid}").st_uid == user.pw_uid for pid in _procs(cgroup))
        assert hidden not in [int(p) for p in (root / "cgroup.procs").read_text().split()]
        # Nor can the user's scripts take a process out.
        moved = subprocess.run(
            [*as_user(JOB_USER), "/bin/sh", "-c", 'echo "$1" > "$2"', "sh", str(hidden),
             str(root / "cgroup.procs")],
            capture_output=True, check=False, cwd="/", timeout=30,
        )  # fmt: skip
        assert moved.returncode != 0
        assert hidden in _procs(cgroup)

        executor.release(job)
        assert not process_alive(hidden)
        assert _procs(cgroup) == []
        assert (cgroup / "cgroup.events").read_text().splitlines()[0] == "populated 0"


def test_a_job_that_cannot_enter_its_cgroup_is_never_started(tmp_path: Path) -> None:
    executor = LocalExecutor(tmp_path)
    command = JobCommand(
        dir=str(tmp_path / "run"), script="touch started", cgroup=str(tmp_path / "not-a-cgroup")
    )
    with pytest.raises(CommandError, match="cannot enter the run's cgroup"):
        executor.spawn(command)
    assert not (tmp_path / "run" / "started").exists()


def test_reconcile_removes_old_empty_run_cgroups_and_keeps_the_rest(cgroup: Path) -> None:
    """What a run's end could not remove: an empty run cgroup older than `EMPTY_AGE_S`
    goes; a fresh empty one (a launch about to enter it) and one holding a process
    stay."""
    old, fresh, busy = (cgroup.with_name(f"{cgroup.name[:30]}{i}{i}") for i in range(3))
    for path in (old, fresh, busy):
        path.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        # Busy before it is made old: the reconcile of a service running beside this
        # test (the parallel suite) would rightly take an old empty one.
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        past = time.time() - EMPTY_AGE_S - 5
        os.utime(old, (past, past))
        os.utime(busy, (past, past))
        remove_empty()
        assert not old.exists()
        assert fresh.exists()
        assert busy.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in (fresh, busy):
            wait_for(lambda path=path: _procs(path) == [], timeout_s=5)
            with contextlib.suppress(OSError):
                path.rmdir()


def test_a_run_as_job_that_locks_its_release_out_is_ended_by_its_cgroup(
    cgroup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's user owns its cgroup's `cgroup.kill` (so its cancel and release can
    use it), so the job can take that right away (`chmod 000`), leave a daemon deaf to
    SIGTERM, and have its wrapper killed from outside: the user's release fails, and
    the worker, root, kills the run's cgroup instead, so nothing of the job outlives
    the end about to be recorded."""
    ensure_user(JOB_USER)
    with shared_dir() as base:
        executor = RunAsExecutor(base / "runs", JOB_USER)
        command = JobCommand(
            dir=str(base / "runs" / "run"),
            script=HIDDEN + f"chmod 000 {cgroup / 'cgroup.kill'}\n: > locked\nexec sleep 600\n",
            env={MARK_ENV: cgroup.name},
            cgroup=str(cgroup),
        )
        assert executor.claim(command.dir, "this test")
        job = executor.spawn(command)
        wait_for((Path(command.dir) / "locked").exists)
        hidden = _the_hidden(cgroup)
        os.killpg(job.pid, signal.SIGKILL)
        wait_for(lambda: not process_alive(job.pid))
        killed: list[str] = []
        kill = runas._kill_cgroup
        monkeypatch.setattr(runas, "_kill_cgroup", lambda c: (killed.append(c), kill(c)))
        executor.release(job)
        assert killed == [str(cgroup)]  # the user's release could not end it
        assert not process_alive(hidden)
        assert _procs(cgroup) == []


def test_the_grace_of_a_cgroup_goes_by_the_clock_not_the_naps(
    cgroup: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded machine makes each 0.1 s nap take far longer (here every `sleep` takes
    1 s): the grace before `cgroup.kill` still ends by the clock (1 s here, 10 s in
    service), not after ten naps."""
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    (bin_dir / "sleep").write_text("#!/bin/sh\nexec /bin/sleep 1\n")
    (bin_dir / "sleep").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    loaded = ScriptExecutor(LocalTransport(env=env), str(tmp_path))
    monkeypatch.setattr(status_scripts, "CANCEL_TERM_WAIT_S", 1)
    command = JobCommand(
        dir=str(tmp_path / "run"),
        script=HIDDEN + "while :; do /bin/sleep 1; done\n",
        env={MARK_ENV: cgroup.name},
        cgroup=str(cgroup),
    )
    job = LocalExecutor(tmp_path).spawn(command)
    _the_hidden(cgroup)
    started = time.monotonic()
    loaded.cancel(job)
    took = time.monotonic() - started
    assert not cgroup.exists()
    assert took < 8, took  # by the naps alone: 10 x 1 s, then more


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_run_as_job_that_kills_or_pauses_its_cancel_is_cancelled_by_its_cgroup(
    cgroup: Path, signal_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's daemon kills (or pauses) every script the worker runs as the job's
    user, the cancel's too. Its status is read by the worker itself (no script), and
    the worker, root, kills the run's cgroup (the daemon with it) and runs the cancel
    again, which records it. A paused script is cut at the
    cancel's deadline (2 s here, 20 s in service)."""
    ensure_user(JOB_USER)
    monkeypatch.setattr(shell, "CANCEL_DEADLINE_S", 2.0)
    with shared_dir() as base:
        (base / "fighter.py").write_text(FIGHTER)
        executor = RunAsExecutor(base / "runs", JOB_USER)
        command = _fighting(base, signal_name, cgroup)
        assert executor.claim(command.dir, "this test")
        job = executor.spawn(command)
        wait_for((Path(command.dir) / "armed").exists)
        # Its status is the worker's own reading, never a script the daemon fights
        # (a script lives a few ms: asked 30 times, the daemon would catch some).
        for _ in range(30):
            assert executor.statuses([job, job]) == [JobStatus.RUNNING] * 2
        # Nor is its follow: the worker reads the run directory itself, so the tick
        # of every run of the target goes on (a paused script held it 30 s, a killed
        # one failed it).
        log = Path(command.dir) / "job.log"
        log.write_bytes(b"step 1\n")
        os.chown(log, executor.user.uid, executor.user.gid)
        for _ in range(30):
            [update] = executor.follow([FollowEntry(job, 0, 0)])
            assert (update.status, update.log) == (JobStatus.RUNNING, b"step 1\n")
        killed: list[str] = []
        kill = runas._kill_cgroup
        monkeypatch.setattr(runas, "_kill_cgroup", lambda c: (killed.append(c), kill(c)))
        executor.cancel(job)
        assert killed == [str(cgroup)]  # the user's first cancel was cut short
        assert _procs(cgroup) == []
        assert executor.status(job) is JobStatus.CANCELLED


def test_a_worker_that_is_not_root_contains_its_runs_in_its_delegated_cgroup() -> None:
    """A worker that is not root, started in a cgroup the operator gave its user
    (the directory and its `cgroup.procs`, as systemd's Delegate=yes does): the
    launcher, as that user, makes the run's cgroup under it and moves itself in (the
    kernel allows it: the common ancestor is the user's), so a child that left the
    session and cleared its environment is held, and the cancel, as that user, ends
    it with the cgroup. Played here by the worker's scripts run as WORKER_USER from
    within the delegated cgroup (`RunAsTransport.entering`: root puts them there)."""
    mount = hierarchy()
    assert mount is not None, "no writable cgroup v2 hierarchy: these tests need root"
    user = ensure_user(WORKER_USER)
    base = mount / f"rw-test-delegated-{new_mark()[:12]}"
    base.mkdir()
    for path in (base, base / "cgroup.procs", base / "cgroup.threads"):
        os.chown(path, user.pw_uid, user.pw_gid)
    assert own_cgroup(mount, f"0::/{base.name}\n") == base
    try:
        with shared_dir() as work:
            os.chown(work, user.pw_uid, user.pw_gid)
            transport = RunAsTransport(job_user(WORKER_USER), worker_is_root=True)
            executor = ScriptExecutor(transport, str(work))
            cgroup = base / CGROUP_PARENT / new_mark()
            command = JobCommand(
                dir=str(work / "run"),
                script=HIDDEN + "while :; do sleep 1; done\n",
                env={MARK_ENV: cgroup.name},
                cgroup=str(cgroup),
            )
            assert executor.claim(command.dir, "this test")
            with transport.entering(str(base)):
                job = executor.spawn(command)
            hidden = _the_hidden(cgroup)
            assert job.pid in _procs(cgroup)
            # Made by the worker's user, not root: nothing else made it.
            assert cgroup.stat().st_uid == user.pw_uid
            executor.cancel(job)
            assert not process_alive(hidden)
            assert not cgroup.exists()
            assert executor.status(job) is JobStatus.CANCELLED
    finally:
        for path in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                with contextlib.suppress(OSError):
                    (path / "cgroup.kill").write_text("1")
                with contextlib.suppress(OSError):
                    path.rmdir()
        base.rmdir()
