"""Jobs run as another user (`RunAsExecutor`), with real users and real processes: the
job's user, the environment it gets, the run directory's hand-over, every operation
through the user's scripts, cancel, and sudo's refusal.

Two workers are played: `root` (this test process, root: scripts run through
`setpriv`) and `sudo` (a worker that is not root: scripts run through `sudo -n -u
JOB_USER`, sudo itself started as WORKER_USER, whose only rule is docs/security.md's line).
The users and the sudo rule are created when missing and left (bench/harness/users.py).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bench.harness.users import (
    JOB_USER,
    WORKER_USER,
    as_user,
    ensure_sudo_rule,
    ensure_user,
    shared_dir,
)
from schemas import JobCommand, JobId, JobStatus
from workers.executors import (
    CommandError,
    InvalidArgument,
    IoError,
    LocalTransport,
    RunAsExecutor,
)
from workers.executors.runas import RUN_AS_KEPT, RUN_AS_PATH, RunAsTransport, job_user
from workers.executors.scripts import FollowEntry

from ....conftest import process_alive, wait_for

HOSTILE_RUN = "r 'q' \"d\" $(touch PWNED) `x` ;&|"
HOSTILE_VALUE = "a 'b' \"c\" $(touch PWNED) `id` \\ ; end"


@pytest.fixture(scope="module")
def job_entry() -> pwd.struct_passwd:
    ensure_user(WORKER_USER)
    ensure_sudo_rule()
    return ensure_user(JOB_USER)


@pytest.fixture
def base() -> Iterator[Path]:
    with shared_dir() as path:
        yield path


def sudo_worker() -> list[str]:
    """How the `sudo` worker runs sudo: as WORKER_USER."""
    return [*as_user(WORKER_USER), "sudo"]


def make_executor(mode: str, workdir: Path, user: str = JOB_USER) -> RunAsExecutor:
    if mode == "root":
        return RunAsExecutor(workdir, user)
    return RunAsExecutor(workdir, user, worker_is_root=False, sudo=sudo_worker())


@pytest.fixture(params=["root", "sudo"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def executor(
    mode: str, base: Path, job_entry: pwd.struct_passwd, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunAsExecutor]:
    """The executor of `mode` on `base/work`. The worker's environment holds a secret,
    a credential and a variable of its own (none may reach a job) and a locale and a
    time zone (kept). For `sudo`, the workdir is the job user's (docs/security.md)."""
    monkeypatch.setenv("RUNWARDEN_SECRET_CANARY", "worker-secret-canary")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-credential-canary")
    monkeypatch.setenv("WORKER_OWN_SETTING", "worker-setting-canary")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("TZ", "UTC")
    workdir = base / "work"
    if mode == "sudo":
        workdir.mkdir()
        os.chown(workdir, job_entry.pw_uid, job_entry.pw_gid)
    with make_executor(mode, workdir) as made:
        yield made


def read(executor: RunAsExecutor, path: str) -> str:
    return executor.read_from(path, 0, 1 << 20).decode()


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def marked(entry: str) -> list[int]:
    """Live processes (not zombies) whose environment holds `entry` (root reads all)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if entry.encode() not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def finished(executor: RunAsExecutor, job: JobId) -> JobStatus | None:
    status = executor.status(job)
    return status if status.is_finished else None


def test_a_job_runs_as_its_user_in_its_directory_with_its_own_environment(
    executor: RunAsExecutor, job_entry: pwd.struct_passwd
) -> None:
    run = f"{executor.workdir}/{HOSTILE_RUN}"
    assert executor.claim(run, "launch-1")
    script = "id -u > uid; pwd > cwd; env > env.txt; ls -ld . > owner"
    job = executor.spawn(
        JobCommand(
            dir=run,
            script=script,
            env={"RUNWARDEN_RUN_ID": "r1", "JOB_VAR": HOSTILE_VALUE},
            secrets={"HF_TOKEN": SecretStr("job-secret " + HOSTILE_VALUE)},
        )
    )
    assert wait_for(lambda: finished(executor, job)) == JobStatus.exited(0)

    assert read(executor, f"{run}/uid").strip() == str(job_entry.pw_uid)
    assert read(executor, f"{run}/cwd").strip() == run
    env = dict(
        line.split("=", 1) for line in read(executor, f"{run}/env.txt").splitlines() if "=" in line
    )
    # Its own variables and its secret reach it, exactly.
    assert env["JOB_VAR"] == HOSTILE_VALUE
    assert env["HF_TOKEN"] == "job-secret " + HOSTILE_VALUE
    assert env["RUNWARDEN_RUN_ID"] == "r1"
    # A sane HOME and PATH: the user's, not the worker's.
    assert env["HOME"] == job_entry.pw_dir
    assert env["USER"] == env["LOGNAME"] == JOB_USER
    assert env["PATH"] == RUN_AS_PATH
    assert (env["LC_TIME"], env["TZ"]) == ("C", "UTC")
    # Nothing else of the worker's, whatever its name.
    text = "\n".join(f"{k}={v}" for k, v in env.items())
    for canary in ("worker-secret-canary", "worker-credential-canary", "worker-setting-canary"):
        assert canary not in text
    shells_own = {"PWD", "OLDPWD", "SHLVL", "_"}
    inherited = set(env) & set(os.environ) - {"HOME", "USER", "LOGNAME", "PATH", "SHELL"}
    assert inherited <= set(RUN_AS_KEPT) | {"LC_TIME"} | shells_own, inherited

    # Every file of the run directory, and the directory, are the user's.
    for path in [Path(run), *Path(run).rglob("*")]:
        assert path.lstat().st_uid == job_entry.pw_uid, path
    assert not list(Path(executor.workdir).rglob("PWNED"))


def test_status_follow_put_and_a_cancel_that_sweeps_a_setsid_child(
    executor: RunAsExecutor, job_entry: pwd.struct_passwd
) -> None:
    run = f"{executor.workdir}/run"
    assert executor.claim(run, "launch-1")
    run_id = f"run-swept-{secrets.token_hex(4)}"
    mark = f"RUNWARDEN_RUN_ID={run_id}"
    script = (
        'setsid sleep 300 & echo "child $!"\n'
        """printf '%s\\n' '{"event": "begin", "time": 1}' >> metrics.jsonl\n"""
        "exec sleep 300"
    )
    job = executor.spawn(
        JobCommand(
            dir=run,
            script=script,
            env={"RUNWARDEN_RUN_ID": run_id},
            deadline_request_after_s=3600,
            watchdog_poll_s=0.2,
        )
    )
    assert executor.status(job) == JobStatus.RUNNING
    assert uid_of(job.pid) == job_entry.pw_uid
    # The watchdog runs as the user too.
    watchdog = int(wait_for(lambda: read(executor, f"{run}/.runwarden/watchdog.pid").strip()))  # type: ignore[arg-type]
    assert uid_of(watchdog) == job_entry.pw_uid

    # Follow reads the log and the metrics as the user.
    def followed() -> object:
        [update] = executor.follow([FollowEntry(job, 0, 0)])
        return update if update.log and update.metrics else None

    update = wait_for(followed)
    assert b"child " in update.log  # type: ignore[attr-defined]
    assert b'"begin"' in update.metrics  # type: ignore[attr-defined]

    # The snapshot request is written as the user.
    executor.put_file(f"{run}/snapshot.request", "cost")
    assert read(executor, f"{run}/snapshot.request") == "cost"
    assert Path(run, "snapshot.request").stat().st_uid == job_entry.pw_uid

    # A child that left the job's session still carries the run's mark.
    child = int(wait_for(lambda: read(executor, f"{run}/job.log").split()[1:2] or None)[0])  # type: ignore[index]
    assert uid_of(child) == job_entry.pw_uid
    assert os.getsid(child) != job.pid
    assert child in marked(mark)

    started = time.monotonic()
    executor.cancel(job)
    assert time.monotonic() - started < 10
    assert executor.status(job) == JobStatus.CANCELLED
    assert marked(mark) == []
    # The watchdog sees the job gone and ends within a poll or two.
    wait_for(lambda: not process_alive(watchdog))


def test_upload_download_and_manifest_as_the_user(
    executor: RunAsExecutor, job_entry: pwd.struct_passwd, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    (source / "data").mkdir(parents=True)
    (source / "data" / "a.txt").write_text("a")
    (source / "train.sh").write_text("echo train")
    run = f"{executor.workdir}/run"
    assert executor.claim(run, "launch-1")
    executor.upload(source, run)
    for path in Path(run).rglob("*"):
        assert path.lstat().st_uid == job_entry.pw_uid, path
    # The job can write into what was uploaded; its private output is still read.
    job = executor.spawn(
        JobCommand(
            dir=run,
            script="echo more > data/b.txt && mkdir output && umask 077 && echo s > output/private",
        )
    )
    assert wait_for(lambda: finished(executor, job)) == JobStatus.exited(0)
    assert Path(run, "output", "private").stat().st_mode & 0o777 == 0o600

    digests = {d.path: d.sha256 for d in executor.manifest(run, ["data", "output"])}
    assert set(digests) == {"data/a.txt", "data/b.txt", "output/private"}
    local = tmp_path / "dl"
    executor.download(run, local, ["data", "output"])
    assert (local / "output" / "private").read_text() == "s\n"
    assert (local / "data" / "b.txt").read_text() == "more\n"


def test_root_hands_the_run_directory_to_the_user(base: Path, job_entry: pwd.struct_passwd) -> None:
    workdir = base / "work"
    executor = RunAsExecutor(workdir, JOB_USER)
    assert workdir.stat().st_uid == 0  # the worker's: the job cannot add siblings
    run = workdir / "run"
    assert executor.claim(str(run), "launch-1")
    assert run.stat().st_uid == job_entry.pw_uid
    assert (run / ".claim").stat().st_uid == job_entry.pw_uid
    assert executor.claim(str(run), "launch-1")  # the same owner claims again
    assert not executor.claim(str(run), "another")

    # A directory of a third user is refused, and stays that user's.
    other = ensure_user(WORKER_USER)
    third = workdir / "third"
    third.mkdir()
    os.chown(third, other.pw_uid, other.pw_gid)
    with pytest.raises(CommandError, match="belongs to uid"):
        executor.claim(str(third), "launch-1")
    assert third.stat().st_uid == other.pw_uid

    # A link in the run directory's place is never followed.
    victim = base / "victim"
    victim.mkdir()
    (workdir / "linked").symlink_to(victim)
    with pytest.raises(IoError):
        executor.claim(str(workdir / "linked"), "launch-1")
    assert victim.stat().st_uid == 0

    # A bad owner is refused before anything is made.
    with pytest.raises(InvalidArgument):
        executor.claim(str(workdir / "never"), "two\nlines")
    assert not (workdir / "never").exists()


def test_without_a_sudo_rule_every_operation_is_one_clear_error(
    base: Path, job_entry: pwd.struct_passwd
) -> None:
    # WORKER_USER may run commands as JOB_USER only: not as `nobody`.
    executor = RunAsExecutor(base / "work", "nobody", worker_is_root=False, sudo=sudo_worker())
    with pytest.raises(CommandError) as refused:
        executor.claim(str(base / "work" / "run"), "launch-1")
    message = str(refused.value)
    assert message.startswith("run as nobody failed: sudo: ")
    assert "ALL=(nobody) NOPASSWD: ALL" in message
    assert not (base / "work").exists()
    with pytest.raises(CommandError, match="run as nobody failed: sudo: "):
        executor.spawn(JobCommand(dir=str(base / "work" / "run"), script="true"))

    missing = RunAsExecutor(base / "w", JOB_USER, worker_is_root=False, sudo=["/nonexistent/sudo"])
    with pytest.raises(CommandError, match="cannot run /nonexistent/sudo: No such file"):
        missing.status(JobId(dir=str(base / "w" / "r"), pid=123456))


def test_an_unknown_user_is_refused_when_the_executor_is_built(base: Path) -> None:
    with pytest.raises(InvalidArgument, match="no user 'rw-no-such-user' on this machine"):
        RunAsExecutor(base / "work", "rw-no-such-user")
    with pytest.raises(InvalidArgument, match="not a user name"):
        RunAsExecutor(base / "work", "$(touch PWNED)")
    assert not list(base.rglob("PWNED"))


def test_a_script_past_its_deadline_under_sudo_is_killed_as_the_user(
    base: Path, job_entry: pwd.struct_passwd, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process is root; a worker that is not root may signal sudo (its own real
    # uid) but not the script sudo runs as the user: the plain transport's kill is
    # cut down to that.
    def kill_sudo_only(self: LocalTransport, proc: subprocess.Popen[bytes]) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)

    monkeypatch.setattr(LocalTransport, "_kill", kill_sudo_only)
    transport = RunAsTransport(job_user(JOB_USER), worker_is_root=False, sudo=sudo_worker())
    started = time.monotonic()
    with pytest.raises(CommandError, match="timed out"):
        transport.run("sleep 47; sleep 48", action="probe", timeout_s=1.0)
    # The transport had the script's group killed as the user: the call returned at
    # its deadline (not once the script ended by itself), and nothing is left.
    assert time.monotonic() - started < 10
    wait_for(lambda: not sleeping(job_entry.pw_uid, "sleep 47"), timeout_s=5)
    time.sleep(0.5)
    assert not sleeping(job_entry.pw_uid, "sleep 48")


def sleeping(uid: int, command: str) -> bool:
    """Whether a live process of `uid` runs exactly `command`."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            words = (proc / "cmdline").read_bytes().replace(b"\0", b" ").strip()
            pid = int(proc.name)
            if words == command.encode() and uid_of(pid) == uid and process_alive(pid):
                return True
        except OSError:
            continue
    return False
