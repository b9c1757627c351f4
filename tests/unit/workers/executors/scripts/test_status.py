"""The status, cancel, claim, put_file, read_from and manifest scripts under both
shells a target may have: dash (`sh`) and `busybox sh`, through
`ScriptExecutor(LocalTransport(shell=...))`, with real detached processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas import JobCommand, JobId, JobStatus
from schemas.protocol import (
    CANCEL_FILE,
    CANCELLING_FILE,
    CLAIM_FILE,
    EXIT_FILE,
    JOB_LOG,
    PID_FILE,
)
from workers.executors import (
    CommandError,
    InvalidArgument,
    LocalTransport,
    ProtocolError,
    ScriptExecutor,
    local_manifest,
)

from .....conftest import wait_for

SHELLS = [("sh",), ("busybox", "sh")]
EXPECTED_BINARY = {("sh",): "dash", ("busybox", "sh"): "busybox"}
DEAD_PID = 4_194_305
"""Above Linux's PID_MAX_LIMIT (4194304): never a process, so never a live group."""
HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>*?\n\tend"
HOSTILE_NAMES = [
    "sp ace",
    "quo'te",
    'dq"uote',
    "new\nline",
    "$(touch PWNED)",
    "`touch PWNED`",
    "-leading",
    "back\\slash",
    "semi;colon&amp|pipe",
    "star*glob?",
    "ünïcödé",
    "tab\there",
    "cr\rhere",
    " lead and trail ",
]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def no_pwned(*roots: Path) -> bool:
    return not any(list(root.rglob("PWNED")) for root in roots) and not Path("PWNED").exists()


class Shell:
    """An executor whose scripts run under one shell, and the jobs it started."""

    def __init__(self, shell: tuple[str, ...], workdir: Path) -> None:
        self.shell = shell
        self.workdir = workdir
        self.executor = ScriptExecutor(LocalTransport(shell=shell), str(workdir))
        self.jobs: list[JobId] = []

    def fresh(self) -> ScriptExecutor:
        """Another executor on the same target, as another process would build it."""
        return ScriptExecutor(LocalTransport(shell=self.shell), str(self.workdir))

    def run_dir(self, name: str = "run") -> str:
        return str(self.workdir / name)

    def spawn(self, script: str, name: str = "run") -> JobId:
        job = self.executor.spawn(JobCommand(dir=self.run_dir(name), script=script))
        self.jobs.append(job)
        return job

    def finished(self, job: JobId) -> JobStatus | None:
        status = self.executor.status(job)
        return status if status.is_finished else None

    def cleanup(self) -> None:
        for job in self.jobs:
            if group_alive(job.pid) and Path(job.dir).is_dir():
                self.executor.cancel(job)
        self.executor.close()


@pytest.fixture(params=SHELLS, ids=" ".join)
def sh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shell]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    shell = Shell(request.param, workdir)
    yield shell
    shell.cleanup()


def crafted(sh: Shell, name: str, files: dict[str, str] | None = None) -> JobId:
    """A run directory holding `files` (protocol name -> content), for a job whose group
    is gone."""
    run = sh.workdir / name
    run.mkdir(parents=True)
    for file, content in (files or {}).items():
        (run / file).write_text(content)
    return JobId(dir=str(run), pid=DEAD_PID)


# --- the shell ----------------------------------------------------------------------


def test_scripts_run_under_the_shell_asked_for(sh: Shell) -> None:
    # Not the script's last command: a shell may exec that one in its own place.
    exe = sh.executor.probe('rw_exe=$(readlink "/proc/$$/exe"); echo "$rw_exe"').decode().strip()
    assert Path(exe).name == EXPECTED_BINARY[sh.shell]


# --- status ---------------------------------------------------------------------------


def test_running_then_exited(sh: Shell) -> None:
    job = sh.spawn("sleep 0.4; exit 3")
    assert sh.executor.status(job) == JobStatus.RUNNING
    assert wait_for(lambda: sh.finished(job)) == JobStatus.exited(3)
    assert (Path(job.dir) / PID_FILE).read_text() == f"{job.pid}\n"
    assert (Path(job.dir) / EXIT_FILE).read_text() == "3\n"


def test_exited_zero_and_negative_codes(sh: Shell) -> None:
    job = sh.spawn("echo hello")
    assert wait_for(lambda: sh.finished(job)) == JobStatus.exited(0)
    assert (Path(job.dir) / JOB_LOG).read_text() == "hello\n"
    # The wrapper writes the code; a code another tool wrote still reads.
    other = crafted(sh, "other", {EXIT_FILE: "-15\n"})
    assert sh.executor.status(other) == JobStatus.exited(-15)


def test_lost_when_killed_without_an_exit_code(sh: Shell) -> None:
    job = sh.spawn("sleep 60")
    os.killpg(job.pid, signal.SIGKILL)
    assert wait_for(lambda: sh.finished(job)) == JobStatus.LOST
    assert not (Path(job.dir) / EXIT_FILE).exists()


def test_lost_without_a_directory_or_a_group(sh: Shell) -> None:
    missing = JobId(dir=sh.run_dir("never-there"), pid=DEAD_PID)
    empty = crafted(sh, "empty")
    assert sh.executor.statuses([missing, empty]) == [JobStatus.LOST, JobStatus.LOST]


def test_the_markers_decide_in_the_seeds_order(sh: Shell) -> None:
    jobs = [
        crafted(sh, "a", {CANCEL_FILE: "", EXIT_FILE: "0\n", CANCELLING_FILE: ""}),
        crafted(sh, "b", {CANCELLING_FILE: "", EXIT_FILE: "4\n"}),
        crafted(sh, "c", {CANCELLING_FILE: ""}),
        crafted(sh, "d", {EXIT_FILE: "7\n"}),
        crafted(sh, "e", {PID_FILE: f"{DEAD_PID}\n"}),
        JobId(dir=sh.run_dir("f"), pid=DEAD_PID),
    ]
    assert sh.executor.statuses(jobs) == [
        JobStatus.CANCELLED,
        JobStatus.exited(4),
        JobStatus.CANCELLED,
        JobStatus.exited(7),
        JobStatus.LOST,
        JobStatus.LOST,
    ]


def test_cancelling_with_a_live_group_is_running(sh: Shell) -> None:
    job = sh.spawn("sleep 60")
    (Path(job.dir) / CANCELLING_FILE).touch()
    (Path(job.dir) / EXIT_FILE).write_text("0\n")  # a recycled pid's old exit code
    assert sh.executor.status(job) == JobStatus.RUNNING
    (Path(job.dir) / EXIT_FILE).unlink()
    os.killpg(job.pid, signal.SIGKILL)
    assert wait_for(lambda: sh.finished(job)) == JobStatus.CANCELLED


def test_a_garbled_exit_code_is_a_protocol_error(sh: Shell) -> None:
    for i, content in enumerate(["abc\n", "", "1 2\n", "99999999999999\n"]):
        job = crafted(sh, f"g{i}", {EXIT_FILE: content})
        with pytest.raises(ProtocolError):
            sh.executor.status(job)


def test_status_of_dirs_with_shell_metacharacters(sh: Shell) -> None:
    names = [HOSTILE_DIR, *HOSTILE_NAMES, "-n", "*", "--", "-e"]
    jobs = [crafted(sh, name, {EXIT_FILE: f"{i}\n"}) for i, name in enumerate(names)]
    assert sh.executor.statuses(jobs) == [JobStatus.exited(i) for i in range(len(names))]
    assert no_pwned(sh.workdir)


def test_a_job_in_a_hostile_directory(sh: Shell) -> None:
    job = sh.spawn("echo ok; sleep 60", HOSTILE_DIR)
    assert Path(job.dir).name == HOSTILE_DIR
    assert sh.executor.status(job) == JobStatus.RUNNING
    sh.executor.cancel(job)
    assert sh.executor.status(job) == JobStatus.CANCELLED
    assert not group_alive(job.pid)
    assert (Path(job.dir) / JOB_LOG).read_text() == "ok\n"
    assert no_pwned(sh.workdir)


def test_statuses_of_real_jobs_in_order(sh: Shell) -> None:
    running = sh.spawn("sleep 60", "a")
    exited = sh.spawn("exit 9", "b")
    cancelled = sh.spawn("sleep 60", "c")
    sh.executor.cancel(cancelled)
    wait_for(lambda: sh.finished(exited))
    gone = JobId(dir=sh.run_dir("gone"), pid=DEAD_PID)
    assert sh.fresh().statuses([running, exited, cancelled, gone]) == [
        JobStatus.RUNNING,
        JobStatus.exited(9),
        JobStatus.CANCELLED,
        JobStatus.LOST,
    ]


# --- cancel ---------------------------------------------------------------------------


def test_cancel_a_running_job(sh: Shell) -> None:
    job = sh.spawn("sleep 60 & sleep 60; wait")
    started = time.monotonic()
    sh.executor.cancel(job)
    assert time.monotonic() - started < 5
    assert sh.executor.status(job) == JobStatus.CANCELLED
    assert (Path(job.dir) / CANCELLING_FILE).exists()
    assert (Path(job.dir) / CANCEL_FILE).exists()
    assert not (Path(job.dir) / EXIT_FILE).exists()
    assert not group_alive(job.pid)


def test_a_job_handling_sigterm_is_cancelled_quickly(sh: Shell) -> None:
    job = sh.spawn("trap 'echo handled; exit 0' TERM; echo ready; while :; do sleep 0.05; done")
    log = Path(job.dir) / JOB_LOG
    wait_for(lambda: log.exists() and "ready" in log.read_text())
    started = time.monotonic()
    sh.executor.cancel(job)
    assert time.monotonic() - started < 3  # well before the 10 s SIGKILL escalation
    assert sh.executor.status(job) == JobStatus.CANCELLED
    assert "handled" in log.read_text()
    assert not group_alive(job.pid)


def test_cancel_is_idempotent_and_spares_ended_jobs(sh: Shell) -> None:
    job = sh.spawn("sleep 60")
    sh.executor.cancel(job)
    marker = Path(job.dir) / CANCEL_FILE
    before = marker.stat().st_mtime_ns
    sh.fresh().cancel(job)
    assert marker.stat().st_mtime_ns == before
    exited = sh.spawn("exit 0", "exited")
    wait_for(lambda: sh.finished(exited))
    sh.executor.cancel(exited)
    assert sh.executor.status(exited) == JobStatus.exited(0)
    assert not (Path(exited.dir) / CANCELLING_FILE).exists()
    assert not (Path(exited.dir) / CANCEL_FILE).exists()


def test_cancel_errors(sh: Shell) -> None:
    with pytest.raises(CommandError, match="does not exist"):
        sh.executor.cancel(JobId(dir=sh.run_dir("gone"), pid=DEAD_PID))
    run = sh.workdir / "run"
    run.mkdir()
    for pid in (0, 1):
        job = JobId.model_construct(dir=str(run), pid=pid, container=None)
        with pytest.raises(InvalidArgument):
            sh.executor.cancel(job)
    assert not (run / CANCELLING_FILE).exists()


# --- claim ----------------------------------------------------------------------------


def test_claim_is_exclusive(sh: Shell) -> None:
    run = sh.run_dir("deep/er/run")
    owner = "owner 'a' $(touch PWNED) `x` \\ é"
    assert sh.executor.claim(run, owner)
    assert sh.executor.claim(run, owner)
    assert not sh.fresh().claim(run, "owner b")
    assert not sh.executor.claim(run, owner + " ")
    assert (Path(run) / CLAIM_FILE).read_text() == owner + "\n"
    assert sorted(os.listdir(run)) == [CLAIM_FILE]
    assert no_pwned(sh.workdir)


def test_concurrent_claims_have_one_winner(sh: Shell) -> None:
    run = sh.run_dir(HOSTILE_DIR)
    results: dict[str, bool] = {}
    start = threading.Barrier(6)

    def claim(owner: str) -> None:
        executor = sh.fresh()
        start.wait()
        results[owner] = executor.claim(run, owner)

    threads = [threading.Thread(target=claim, args=(f"owner {i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [owner for owner, won in results.items() if won]
    assert len(results) == 6
    assert len(winners) == 1
    assert (Path(run) / CLAIM_FILE).read_text() == winners[0] + "\n"
    assert sorted(os.listdir(run)) == [CLAIM_FILE]


@pytest.mark.parametrize("owner", ["", "two\nlines", "cr\r", "nul\0"])
def test_claim_refuses_a_bad_owner(sh: Shell, owner: str) -> None:
    with pytest.raises(InvalidArgument):
        sh.executor.claim(sh.run_dir(), owner)
    assert not (sh.workdir / "run").exists()


# --- put_file and read_from ----------------------------------------------------------


def test_put_file_content_is_exact(sh: Shell) -> None:
    path = f"{sh.run_dir(HOSTILE_DIR)}/snapshot.request"
    contents = [
        "",
        "deadline",
        "a\nb\r\n\n",
        "$(touch PWNED) 'q' `touch PWNED` \\ é",
        "%s%d\\0\\n",
        "-n",
        "-e \\c",
        " lead and trail \n\n",
    ]
    for content in contents:
        sh.executor.put_file(path, content)
        assert Path(path).read_bytes() == content.encode()
        assert sh.executor.read_from(path, 0, 1000) == content.encode()
    assert sorted(os.listdir(Path(path).parent)) == ["snapshot.request"]
    with pytest.raises(InvalidArgument):
        sh.executor.put_file(path, "nul\0")
    with pytest.raises(InvalidArgument):
        sh.executor.put_file("relative/path", "x")
    assert no_pwned(sh.workdir)


def test_read_from_ranges(sh: Shell) -> None:
    path = sh.workdir / "name $(touch PWNED) 'q'"
    data = bytes(range(256)) * 40
    path.write_bytes(data)
    read = sh.executor.read_from
    assert read(str(path), 0, 10) == data[:10]
    assert read(str(path), 100, 5000) == data[100:5100]
    assert read(str(path), len(data) - 3, 100) == data[-3:]
    assert read(str(path), len(data), 5) == b""
    assert read(str(path), len(data) + 50, 5) == b""
    assert read(str(path), 5, 0) == b""
    assert read(str(sh.workdir / "missing"), 0, 10) == b""
    with pytest.raises(CommandError):
        read(str(sh.workdir), 0, 10)
    with pytest.raises(InvalidArgument):
        read(str(path), -1, 10)
    assert no_pwned(sh.workdir)


# --- manifest -------------------------------------------------------------------------


def make_tree(root: Path) -> None:
    checkpoint = root / "output" / "checkpoint-3"
    (checkpoint / "nested dir $(touch PWNED)").mkdir(parents=True)
    for i, name in enumerate(HOSTILE_NAMES):
        (checkpoint / name).write_bytes(f"{i} {name}".encode())
        (checkpoint / "nested dir $(touch PWNED)" / name).write_bytes(os.urandom(i * 100))
    (checkpoint / "scratch.tmp").write_text("excluded")
    (checkpoint / "cache.tmp").mkdir()
    (checkpoint / "cache.tmp" / "inside").write_text("excluded")
    (checkpoint / "link").symlink_to("quo'te")
    (checkpoint / "empty").write_bytes(b"")
    (root / "snapshot.json").write_text("{}")
    (root / "-dash-entry").write_text("dash")
    (root / "job.log").write_text("log\n")


def test_manifest_equals_the_local_manifest(sh: Shell) -> None:
    remote = sh.workdir / HOSTILE_DIR
    make_tree(remote)
    entries = ["output/checkpoint-3", "snapshot.json", "-dash-entry", "missing $(x)"]
    exclude = ["*.tmp"]
    manifest = sh.executor.manifest(str(remote), entries, exclude)
    assert manifest == local_manifest(remote, entries, exclude)
    paths = [digest.path for digest in manifest]
    assert len(paths) == 2 * len(HOSTILE_NAMES) + 3
    for name in HOSTILE_NAMES:
        assert f"output/checkpoint-3/{name}" in paths
        assert f"output/checkpoint-3/nested dir $(touch PWNED)/{name}" in paths
    assert "output/checkpoint-3/link" not in paths
    assert not any(".tmp" in path for path in paths)
    assert "job.log" not in paths
    assert sh.executor.manifest(str(remote), ["output"]) == local_manifest(remote, ["output"])
    assert no_pwned(sh.workdir)


def test_manifest_of_nothing_and_of_a_missing_root(sh: Shell) -> None:
    remote = sh.workdir / "run"
    remote.mkdir()
    assert sh.executor.manifest(str(remote), ["missing"]) == []
    assert sh.executor.manifest(str(remote), []) == []
    with pytest.raises(CommandError, match="does not exist"):
        sh.executor.manifest(str(sh.workdir / "gone"), ["a"])
    with pytest.raises(InvalidArgument):
        sh.executor.manifest(str(remote), ["../escape"])
    with pytest.raises(InvalidArgument):
        sh.executor.manifest(str(remote), ["a"], ["[ab]"])
