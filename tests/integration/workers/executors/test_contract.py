"""The executor contract, written once and run against every executor (`target`
fixture: local, shell; the SSH executor joins it), with real detached processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from bench.harness.processes import processes_carrying
from schemas import JobCommand, JobId, JobStatus
from schemas.protocol import (
    CANCEL_FILE,
    CANCELLING_FILE,
    CLAIM_FILE,
    EXIT_FILE,
    MARK_ENV,
    PID_FILE,
    new_mark,
)
from workers.executors import (
    CommandError,
    Downloaded,
    InvalidArgument,
    InvalidSecret,
    LineStream,
    Link,
    LocalExecutor,
    local_manifest,
)
from workers.executors.errors import ExecError, IoError, ProtocolError

from ....conftest import Target, toy_command, toy_env, wait_for
from ....shells import run_script

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
]
HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `x` ;&|<>*"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def finished(target: Target, job: JobId) -> JobStatus | None:
    status = target.executor.status(job)
    return status if status.is_finished else None


def spawn(target: Target, script: str, name: str = "run", **kw: object) -> JobId:
    return target.executor.spawn(JobCommand(dir=target.run_dir(name), script=script, **kw))  # type: ignore[arg-type]


# --- spawn and status --------------------------------------------------------------


def test_status_of_running_then_exited(target: Target) -> None:
    job = spawn(target, "sleep 2; exit 3")
    assert target.executor.status(job) == JobStatus.RUNNING
    assert wait_for(lambda: finished(target, job)) == JobStatus.exited(3)
    run = Path(job.dir)
    assert (run / PID_FILE).read_text().strip() == str(job.pid)
    assert (run / EXIT_FILE).read_text().strip() == "3"


def test_exit_zero_and_output_in_log(target: Target) -> None:
    job = spawn(target, "echo out; echo err >&2")
    assert wait_for(lambda: finished(target, job)) == JobStatus.exited(0)
    assert (Path(job.dir) / "job.log").read_text().splitlines() == ["out", "err"]


def test_job_survives_the_death_of_its_spawner(target: Target) -> None:
    job = target.spawn_from_a_dying_process("sleep 60")
    time.sleep(0.3)
    # A new executor, as another process would build it, finds the job running.
    fresh = target.make()
    assert fresh.status(job) == JobStatus.RUNNING
    assert group_alive(job.pid)
    fresh.cancel(job)
    assert fresh.status(job) == JobStatus.CANCELLED
    assert not group_alive(job.pid)


def test_lost_when_killed_without_exit_code(target: Target) -> None:
    job = spawn(target, "sleep 60")
    wait_for((Path(job.dir) / PID_FILE).exists)
    os.killpg(job.pid, signal.SIGKILL)
    assert wait_for(lambda: finished(target, job)) == JobStatus.LOST
    assert not (Path(job.dir) / EXIT_FILE).exists()


def test_lost_when_the_run_directory_is_gone(target: Target) -> None:
    job = JobId(dir=str(target.workdir / "never-there"), pid=999_999)
    assert target.executor.status(job) == JobStatus.LOST


def test_statuses_batch_in_order(target: Target) -> None:
    running = spawn(target, "sleep 30", "a")
    exited = spawn(target, "exit 4", "b")
    wait_for(lambda: finished(target, exited))
    gone = JobId(dir=str(target.workdir / "gone"), pid=999_999)
    assert target.executor.statuses([running, exited, gone]) == [
        JobStatus.RUNNING,
        JobStatus.exited(4),
        JobStatus.LOST,
    ]
    target.executor.cancel(running)


def test_spawn_clears_stale_markers(target: Target) -> None:
    run = target.workdir / "run"
    run.mkdir()
    for name in (EXIT_FILE, CANCELLING_FILE, CANCEL_FILE, PID_FILE):
        (run / name).write_text("7\n")
    # A request and a proof of an earlier job (or an uploaded directory) go too: a new
    # job must not stop at once, nor be recorded stopped by an old proof.
    (run / "snapshot.request").write_text("requested")
    (run / "snapshot.json").write_text('{"checkpoint": "output/checkpoint-1", "step": 1}')
    job = spawn(target, "sleep 30")
    assert target.executor.status(job) == JobStatus.RUNNING
    assert not (run / CANCEL_FILE).exists()
    assert not (run / "snapshot.request").exists()
    assert not (run / "snapshot.json").exists()
    target.executor.cancel(job)


def test_a_hostile_run_directory_name(target: Target) -> None:
    job = spawn(target, "echo ok; sleep 30", HOSTILE_DIR)
    assert Path(job.dir).name == HOSTILE_DIR
    assert target.executor.status(job) == JobStatus.RUNNING
    request = f"{job.dir}/snapshot.request"
    target.executor.put_file(request, "cost")
    assert target.executor.read_from(request, 0, 100) == b"cost"
    target.executor.cancel(job)
    assert target.executor.status(job) == JobStatus.CANCELLED
    assert not list(target.workdir.rglob("PWNED"))
    assert not Path("PWNED").exists()


# --- cancel ------------------------------------------------------------------------


def test_cancel_a_running_job(target: Target) -> None:
    job = spawn(target, "sleep 60")
    started = time.monotonic()
    target.executor.cancel(job)
    assert time.monotonic() - started < 5
    assert target.executor.status(job) == JobStatus.CANCELLED
    assert (Path(job.dir) / CANCELLING_FILE).exists()
    assert (Path(job.dir) / CANCEL_FILE).exists()
    assert not group_alive(job.pid)


def test_cancel_twice_is_a_no_op(target: Target) -> None:
    job = spawn(target, "sleep 60")
    target.executor.cancel(job)
    marker = Path(job.dir) / CANCEL_FILE
    before = marker.stat().st_mtime_ns
    started = time.monotonic()
    target.executor.cancel(job)
    assert time.monotonic() - started < 2
    assert marker.stat().st_mtime_ns == before
    assert target.executor.status(job) == JobStatus.CANCELLED


def test_cancel_an_exited_job_changes_nothing(target: Target) -> None:
    job = spawn(target, "exit 0")
    wait_for(lambda: finished(target, job))
    target.executor.cancel(job)
    assert target.executor.status(job) == JobStatus.exited(0)
    assert not (Path(job.dir) / CANCELLING_FILE).exists()
    assert not (Path(job.dir) / CANCEL_FILE).exists()


@pytest.mark.parametrize("marker", [EXIT_FILE, CANCEL_FILE])
def test_a_recycled_pid_is_never_signalled(target: Target, marker: str) -> None:
    # The pid in job.pid now belongs to an unrelated process group.
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run = target.workdir / "run"
        run.mkdir()
        (run / marker).write_text("0\n")
        job = JobId(dir=str(run), pid=stranger.pid)
        target.executor.cancel(job)
        time.sleep(0.2)
        assert stranger.poll() is None
        expected = JobStatus.exited(0) if marker == EXIT_FILE else JobStatus.CANCELLED
        assert target.executor.status(job) == expected
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize("marker", [EXIT_FILE, CANCEL_FILE])
def test_a_recycled_pid_with_another_start_time_is_never_signalled(
    target: Target, marker: str
) -> None:
    # The job's leader started at another time than the process now at its pid: that
    # group is not the job's, whatever the run directory holds.
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run = target.workdir / "run"
        run.mkdir()
        job = JobId(dir=str(run), pid=stranger.pid, start=1)
        assert target.executor.status(job) == JobStatus.LOST
        target.executor.cancel(job)
        time.sleep(0.2)
        assert stranger.poll() is None
        (run / marker).write_text("0\n")
        target.executor.cancel(job)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize("marker", [EXIT_FILE, CANCEL_FILE])
def test_a_job_cannot_forge_its_end(target: Target, marker: str) -> None:
    job = spawn(target, f"echo 0 > {marker}; sleep 60")
    marker_file = Path(job.dir) / marker
    wait_for(marker_file.exists)
    assert job.start is not None
    assert target.executor.status(job) == JobStatus.RUNNING
    target.executor.cancel(job)  # signals the live group, whatever its files say
    assert not group_alive(job.pid)
    assert target.executor.status(job) == JobStatus.CANCELLED


def test_pid_zero_and_one_are_never_signalled(argument_target: Target) -> None:
    run = argument_target.workdir / "run"
    run.mkdir()
    for pid in (0, 1, -5):
        job = JobId.model_construct(dir=str(run), pid=pid, container=None)
        with pytest.raises(InvalidArgument):
            argument_target.executor.cancel(job)
        with pytest.raises(InvalidArgument):
            argument_target.executor.status(job)
    assert not (run / CANCELLING_FILE).exists()


def test_cancel_a_missing_run_directory_with_no_job_does_nothing(target: Target) -> None:
    # A job may delete its own run directory: cancel still ends a live group (see
    # test_a_job_that_deletes_its_run_directory_is_still_cancelled); with none, there
    # is nothing to do, and no error that a retry could never clear.
    job = JobId(dir=str(target.workdir / "gone"), pid=999_999)
    target.executor.cancel(job)
    assert not (target.workdir / "gone").exists()


def test_a_job_that_deletes_its_run_directory_is_still_cancelled(target: Target) -> None:
    job = spawn(target, 'cd /; rm -rf -- "$RW_DIR"; sleep 60', env={"RW_DIR": target.run_dir()})
    wait_for(lambda: not Path(job.dir).exists())
    assert job.start is not None
    assert target.executor.status(job) == JobStatus.RUNNING
    target.executor.cancel(job)
    assert not group_alive(job.pid)
    assert target.executor.status(job) == JobStatus.LOST


def test_an_abandoned_cancelling_marker(target: Target) -> None:
    # A cancel killed right after writing `cancelling`: the job then ends normally.
    job = spawn(target, "sleep 2; exit 0")
    (Path(job.dir) / CANCELLING_FILE).touch()
    assert target.executor.status(job) == JobStatus.RUNNING
    assert wait_for(lambda: finished(target, job)) == JobStatus.exited(0)


def test_cancelling_with_the_group_gone_and_no_exit_code_is_cancelled(target: Target) -> None:
    job = spawn(target, "sleep 60")
    (Path(job.dir) / CANCELLING_FILE).touch()
    assert target.executor.status(job) == JobStatus.RUNNING
    os.killpg(job.pid, signal.SIGKILL)
    assert wait_for(lambda: finished(target, job)) == JobStatus.CANCELLED


@pytest.mark.slow
def test_cancel_escalates_to_sigkill_and_the_whole_group_goes(target: Target) -> None:
    job = spawn(target, toy_command("--steps", "100000", "--ignore-sigterm", "--spawn-child"))
    child_file = Path(job.dir) / "child.pid"
    child = int(str(wait_for(lambda: child_file.exists() and child_file.read_text().strip())))
    assert process_alive(child)
    # A plain kill of the leader alone would leave the child: only the group goes.
    started = time.monotonic()
    target.executor.cancel(job)
    took = time.monotonic() - started
    assert 9 < took < 25, took
    assert not group_alive(job.pid)
    assert not process_alive(child)
    assert target.executor.status(job) == JobStatus.CANCELLED


def test_release_ends_at_once_what_a_job_killed_from_outside_left_carrying_its_mark(
    target: Target,
) -> None:
    """A job's group SIGKILLed from outside (no wrapper's sweep, no cancel's: its end
    reads `lost`) leaves a loop of its own session, deaf to SIGTERM: the release that
    comes before its end is recorded (`workers.finish`) ends it at once, not after a
    grace; a second release finds nothing and is no error."""
    mark = new_mark()
    entry = f"{MARK_ENV}={mark}"
    deaf = (
        "setsid sh -c 'trap \"\" TERM; : > looping; while :; do sleep 1; done'"
        " </dev/null >/dev/null 2>&1 &"
    )
    job = spawn(target, f"{deaf}\nexec sleep 600", env={MARK_ENV: mark})
    assert job.mark == mark
    try:
        wait_for((Path(job.dir) / "looping").exists)
        os.killpg(job.pid, signal.SIGKILL)
        assert wait_for(lambda: finished(target, job)) == JobStatus.LOST
        assert processes_carrying(entry) != []  # the loop outlived its group
        started = time.monotonic()
        target.executor.release(job)
        assert time.monotonic() - started < 3
        assert processes_carrying(entry) == []
        target.executor.release(job)
    finally:
        for pid in processes_carrying(entry):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_job_that_handles_sigterm_ends_fast(target: Target) -> None:
    job = spawn(target, toy_command("--steps", "100000", "--step-time", "0.05"))
    wait_for(lambda: (Path(job.dir) / "metrics.jsonl").exists() or True)
    started = time.monotonic()
    target.executor.cancel(job)
    assert time.monotonic() - started < 5
    assert target.executor.status(job) == JobStatus.CANCELLED


# --- secrets and environment -------------------------------------------------------

SECRET = "s3cr3t $(touch PWNED) 'q' \"d\" `x` \\n ; | & é"


def test_secrets_reach_the_env_only(target: Target) -> None:
    import hashlib

    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    job = spawn(
        target,
        toy_command("--steps", "100000", "--print-env", "HF_TOKEN"),
        secrets={"HF_TOKEN": SecretStr(SECRET)},
    )
    log = Path(job.dir) / "job.log"
    wait_for(lambda: digest in log.read_text(errors="replace"))
    environ = Path(f"/proc/{job.pid}/environ").read_bytes().split(b"\0")
    assert any(e == b"HF_TOKEN=" + SECRET.encode() for e in environ)
    # Not on any command line of any process on this machine, while the job runs.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, check=True).stdout
    assert SECRET.encode() not in ps
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            assert SECRET.encode() not in cmdline.read_bytes()
    target.executor.cancel(job)
    for path in target.workdir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert not list(target.workdir.rglob("PWNED"))


def test_secrets_named_like_the_launcher_s_own_reach_the_job_exactly(target: Target) -> None:
    """Secrets named `PATH`, `HOME` and the launcher's own `rw_*` names, with values
    that quote, substitute and start and end with blanks, reach the job as they are
    (read from its leader's environment) and change nothing the launcher does (the
    job started, its leader's start time known). Names a shell sets by itself (`IFS`)
    are refused: test_invalid_secrets_start_nothing."""
    names = ["PATH", "HOME", "rw_setsid", "rw_sh", "rw_mv", "rw_pid", "rw_st", "rw_i"]
    values = {n: f" \t{n}'\"$(touch PWNED)`id`\\ ; " for n in names}
    job = spawn(
        target,
        "PATH=/usr/bin:/bin; sleep 30",
        secrets={n: SecretStr(v) for n, v in values.items()},
    )
    entries = Path(f"/proc/{job.pid}/environ").read_bytes().split(b"\0")
    environ = dict(e.decode().partition("=")[::2] for e in entries if b"=" in e)
    assert {n: environ.get(n) for n in names} == values
    assert job.start is not None
    assert target.executor.status(job) is JobStatus.RUNNING
    target.executor.cancel(job)
    assert not list(target.workdir.rglob("PWNED"))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("1BAD", "x"),
        ("A-B", "x"),
        ("", "x"),
        ("OK", "a\nb"),
        ("OK", "a\rb"),
        ("OK", "a\0b"),
        ("IFS", "x"),
        ("PWD", "x"),
        ("OPTIND", "x"),
    ],
)
def test_invalid_secrets_start_nothing(argument_target: Target, name: str, value: str) -> None:
    # Built without validation, as a careless caller could: the executor checks again.
    job = JobCommand.model_construct(
        dir=argument_target.run_dir(),
        script="echo started > started",
        env={},
        secrets={name: SecretStr(value)},
        container=None,
    )
    with pytest.raises(InvalidSecret) as raised:
        argument_target.executor.spawn(job)
    assert value not in str(raised.value) or value == "x"
    time.sleep(0.2)
    assert not (argument_target.workdir / "run" / "started").exists()
    assert not (argument_target.workdir / "run" / PID_FILE).exists()


def test_job_env_is_set(target: Target) -> None:
    job = spawn(
        target,
        'printf "%s" "$RUNWARDEN_SNAPSHOT_REQUEST" > seen',
        env={"RUNWARDEN_SNAPSHOT_REQUEST": "/x/$(y) 'z'/snapshot.request"},
    )
    wait_for(lambda: finished(target, job))
    assert (Path(job.dir) / "seen").read_text() == "/x/$(y) 'z'/snapshot.request"


@pytest.mark.usefixtures("env_without_runwarden")
def test_a_local_job_does_not_inherit_service_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a local job inherits this process's environment: a remote one gets the
    # SSH server's.
    executor = LocalExecutor(tmp_path)
    monkeypatch.setenv("RUNWARDEN_REDIS_URL", "redis://:pw@host")
    monkeypatch.setenv("OVERBRAINER_TOKEN", "t")
    monkeypatch.setenv("VAULT_TOKEN", "v")
    monkeypatch.setenv("KEEP_ME", "k")
    command = JobCommand(
        dir=str(tmp_path / "run"), script="env > env.txt", env={"RUNWARDEN_METRICS": "/m"}
    )
    job = executor.spawn(command)
    wait_for(lambda: executor.status(job).is_finished)
    names = {line.split("=", 1)[0] for line in (Path(job.dir) / "env.txt").read_text().splitlines()}
    assert "KEEP_ME" in names
    assert "RUNWARDEN_METRICS" in names
    assert not names & {"RUNWARDEN_REDIS_URL", "OVERBRAINER_TOKEN", "VAULT_TOKEN"}


# --- claim, put_file, read_from, probe ---------------------------------------------


def test_claim_by_two_owners(target: Target) -> None:
    run = target.run_dir("deep/er/run")
    assert target.executor.claim(run, "owner-a")
    assert target.executor.claim(run, "owner-a")
    assert not target.executor.claim(run, "owner-b")
    assert (Path(run) / CLAIM_FILE).read_text() == "owner-a\n"
    assert sorted(os.listdir(run)) == [CLAIM_FILE]


def test_concurrent_claims_have_one_winner(target: Target) -> None:
    run = target.run_dir()
    results: dict[str, bool] = {}

    def claim(owner: str) -> None:
        results[owner] = target.make().claim(run, owner)

    threads = [threading.Thread(target=claim, args=(f"owner {i} $(x)",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [owner for owner, won in results.items() if won]
    assert len(winners) == 1
    assert (Path(run) / CLAIM_FILE).read_text() == winners[0] + "\n"
    assert sorted(os.listdir(run)) == [CLAIM_FILE]


@pytest.mark.parametrize("owner", ["", "two\nlines", "cr\r", "nul\0"])
def test_claim_refuses_a_bad_owner(argument_target: Target, owner: str) -> None:
    with pytest.raises(InvalidArgument):
        argument_target.executor.claim(argument_target.run_dir(), owner)
    assert not (argument_target.workdir / "run").exists()


def test_read_from_ranges(target: Target) -> None:
    path = target.workdir / "data.txt"
    path.write_bytes(b"0123456789")
    read = target.executor.read_from
    assert read(str(path), 2, 3) == b"234"
    assert read(str(path), 0, 100) == b"0123456789"
    assert read(str(path), 8, 100) == b"89"
    assert read(str(path), 10, 5) == b""
    assert read(str(path), 50, 5) == b""
    assert read(str(path), 0, 0) == b""
    assert read(str(target.workdir / "missing"), 0, 10) == b""
    with pytest.raises(ExecError):
        read(str(target.workdir), 0, 10)
    with pytest.raises(InvalidArgument):
        read("relative/path", 0, 10)


def test_a_regular_file_whose_read_fails_is_a_protocol_error_on_a_script_target(
    target: Target,
) -> None:
    """A path that passes the scripts' test for a regular file but whose read then
    fails, as when a job swaps its file for a link, a FIFO or a directory between the
    test and the read (here `/proc/self/mem`, a regular file of procfs whose offset 0
    no process maps: the reading process gets EIO every time): what the job wrote, a
    `ProtocolError` (the callers take it as garbage), never the target's failure. The
    local executor checks the type on the descriptor it reads, so it has no such race:
    its EIO is an I/O error of this machine."""
    read = target.executor.read_from
    if target.kind == "local":
        with pytest.raises(IoError):
            read("/proc/self/mem", 0, 16)
        return
    with pytest.raises(ProtocolError, match="could not be read as a regular file"):
        read("/proc/self/mem", 0, 16)


def test_read_from_binary(target: Target) -> None:
    path = target.workdir / "bin"
    data = bytes(range(256)) * 64
    path.write_bytes(data)
    assert target.executor.read_from(str(path), 100, 5000) == data[100:5100]


def test_put_file_replaces_atomically(target: Target) -> None:
    path = target.workdir / "new" / "dir" / "snapshot.request"
    contents = {"a" * 40_000, "b" * 40_000}
    target.executor.put_file(str(path), "a" * 40_000)
    seen: set[str] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.add(path.read_text())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        writer = target.make()
        for i in range(30):
            writer.put_file(str(path), "b" * 40_000 if i % 2 else "a" * 40_000)
    finally:
        stop.set()
        thread.join()
    assert seen <= contents
    assert sorted(os.listdir(path.parent)) == ["snapshot.request"]


def test_put_file_content_is_exact(target: Target) -> None:
    path = str(target.workdir / "x")
    for content in ["", "deadline", "a\nb\r\n", "$(touch PWNED) 'q' `x` \\ é", "%s%d\\0"]:
        target.executor.put_file(path, content)
        assert Path(path).read_bytes().decode() == content
    assert not list(target.workdir.rglob("PWNED"))


def test_probe(target: Target) -> None:
    assert run_script(target.executor, "echo hello; df -P . >/dev/null") == b"hello\n"
    with pytest.raises(CommandError) as raised:
        run_script(target.executor, "echo nope >&2; exit 3")
    assert raised.value.action == "probe"
    assert "nope" in raised.value.message


# --- upload, download, manifest ----------------------------------------------------


def make_tree(root: Path) -> None:
    (root / "output" / "checkpoint-3" / "nested").mkdir(parents=True)
    for i, name in enumerate(HOSTILE_NAMES):
        (root / "output" / "checkpoint-3" / name).write_bytes(f"{i} {name}".encode())
    (root / "output" / "checkpoint-3" / "nested" / "weights.bin").write_bytes(os.urandom(70_000))
    (root / "output" / "checkpoint-3" / "nested" / "scratch.tmp").write_text("excluded")
    (root / "output" / "checkpoint-3" / "cache.tmp").mkdir()
    (root / "output" / "checkpoint-3" / "cache.tmp" / "inside").write_text("excluded")
    (root / "output" / "checkpoint-3" / "link").symlink_to("nested/weights.bin")
    (root / "snapshot.json").write_text("{}")
    (root / "-dash-entry").write_text("dash")
    (root / "job.log").write_text("log\n")


def test_upload_skips_top_level_entries(target: Target, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / ".git").mkdir(parents=True)
    (source / ".git" / "HEAD").write_text("ref")
    (source / "secret.env").write_text("TOKEN=x")
    (source / "pkg" / "secret.env").parent.mkdir()
    (source / "pkg" / "secret.env").write_text("nested is kept")
    (source / "train.py").write_text("print(1)")
    (source / "sp ace $(x)").write_text("odd")
    remote = target.run_dir("up")
    target.executor.upload(source, remote, [".git", "secret.env"])
    assert sorted(os.listdir(remote)) == ["pkg", "sp ace $(x)", "train.py"]
    assert (Path(remote) / "pkg" / "secret.env").read_text() == "nested is kept"


def test_upload_copies_bytes_modes_times_and_links_as_they_are(
    target: Target, tmp_path: Path
) -> None:
    """Each file's bytes, mode and modification time (to the second), a directory's
    content, a link as a link (never followed); a FIFO or a socket is left out."""
    source = tmp_path / "src"
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (source / "bin" / "run.sh").chmod(0o755)
    (source / "private.key").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    (source / "private.key").chmod(0o600)
    (source / "latest").symlink_to("bin/run.sh")
    (source / "outside").symlink_to("/etc")
    os.mkfifo(source / "pipe")
    os.utime(source / "bin" / "run.sh", (1_700_000_000, 1_700_000_000))
    remote = Path(target.run_dir("up"))
    target.executor.upload(source, str(remote))
    assert sorted(os.listdir(remote)) == ["bin", "latest", "outside", "private.key"]
    for name in ("bin/run.sh", "private.key"):
        sent, got = (source / name).stat(), (remote / name).stat()
        assert (remote / name).read_bytes() == (source / name).read_bytes(), name
        assert oct(got.st_mode & 0o7777) == oct(sent.st_mode & 0o7777), name
        assert int(got.st_mtime) == int(sent.st_mtime), name
    assert os.readlink(remote / "latest") == "bin/run.sh"
    assert os.readlink(remote / "outside") == "/etc"


def test_manifest_and_download_with_hostile_names(target: Target, tmp_path: Path) -> None:
    remote = target.workdir / "run"
    make_tree(remote)
    entries = ["output/checkpoint-3", "snapshot.json", "-dash-entry", "missing"]
    exclude = ["*.tmp"]
    manifest = target.executor.manifest(str(remote), entries, exclude)
    paths = [d.path for d in manifest]
    assert paths == sorted(paths)
    for name in HOSTILE_NAMES:
        assert f"output/checkpoint-3/{name}" in paths
    assert "output/checkpoint-3/nested/weights.bin" in paths
    assert not any(p.endswith(".tmp") or "cache.tmp" in p for p in paths)
    assert "output/checkpoint-3/link" not in paths  # links are not followed
    assert "job.log" not in paths
    assert manifest == local_manifest(remote, entries, exclude)

    local = tmp_path / "dl"
    # The digests of what was written, without reading it back, are the manifest's.
    got = target.executor.download(str(remote), local, entries, exclude)
    assert got.files == manifest
    assert got.links == [Link("output/checkpoint-3/link", "nested/weights.bin")]
    assert got.skipped_links == []
    assert local_manifest(local, entries, exclude) == manifest
    assert not (local / "output" / "checkpoint-3" / "cache.tmp").exists()
    assert not (local / "output" / "checkpoint-3" / "nested" / "scratch.tmp").exists()
    assert (local / "output" / "checkpoint-3" / "link").is_symlink()
    assert not list(tmp_path.rglob("PWNED"))
    assert not Path("PWNED").exists()


def test_download_of_nothing_creates_nothing(target: Target, tmp_path: Path) -> None:
    remote = target.workdir / "run"
    remote.mkdir()
    local = tmp_path / "none"
    assert target.executor.download(str(remote), local, ["missing", "also/missing"]) == (
        Downloaded()
    )
    assert not local.exists()
    assert target.executor.manifest(str(remote), ["missing"]) == []


def test_download_and_manifest_of_a_missing_root(target: Target, tmp_path: Path) -> None:
    missing = str(target.workdir / "gone")
    with pytest.raises(CommandError, match="does not exist") as raised:
        target.executor.download(missing, tmp_path / "x", ["a"])
    assert raised.value.action == "download"
    with pytest.raises(CommandError, match="does not exist"):
        target.executor.manifest(missing, ["a"])


@pytest.mark.parametrize("entry", ["../escape", "/etc", "a/../../b", "./a", "a//b", "", "a/"])
def test_entries_that_leave_the_run_directory_are_refused(
    argument_target: Target, tmp_path: Path, entry: str
) -> None:
    remote = argument_target.workdir / "run"
    remote.mkdir()
    with pytest.raises(InvalidArgument):
        argument_target.executor.manifest(str(remote), [entry])
    with pytest.raises(InvalidArgument):
        argument_target.executor.download(str(remote), tmp_path / "x", [entry])


@pytest.mark.parametrize("pattern", ["a/b", "[ab]", "back\\slash", ""])
def test_unsupported_exclude_patterns_are_refused(argument_target: Target, pattern: str) -> None:
    with pytest.raises(InvalidArgument):
        argument_target.executor.manifest(str(argument_target.workdir), ["x"], [pattern])


# --- tail --------------------------------------------------------------------------


def test_tail_with_cr_progress_and_a_3_mib_line(target: Target) -> None:
    path = target.workdir / "job.log"
    big = "x" + "é" * (3 * 1024 * 1024 // 2)  # 3 MiB + 1 byte, cut points fall mid-char
    path.write_bytes(b"")
    stream = target.executor.tail(str(path))
    assert isinstance(stream, LineStream)
    with path.open("ab") as handle:
        handle.write(b"10%\r20%\r30%\r\nstep 1\npartial")
    assert stream.poll() == ["10%", "20%", "30%", "step 1"]
    assert stream.poll() == []
    with path.open("ab") as handle:
        handle.write(b" done\n" + big.encode() + b"\nlast\r")
    lines: list[str] = []
    for _ in range(10):
        lines += stream.poll()
    assert lines[0] == "partial done"
    assert lines[-1] == "last"
    pieces = lines[1:-1]
    assert len(pieces) == 4
    assert all(len(p.encode()) <= 1024 * 1024 for p in pieces)
    assert "".join(pieces) == big
    assert "\ufffd" not in "".join(pieces)
    # A `\n` arriving after a lone `\r` is the same line end, not an empty line.
    with path.open("ab") as handle:
        handle.write(b"\nnext\n")
    assert stream.poll() == ["next"]
    assert stream.offset == path.stat().st_size


def test_tail_follows_until_told_to_stop(target: Target) -> None:
    job = spawn(target, "for i in 1 2 3; do echo line $i; sleep 0.2; done")
    stream = target.executor.tail(f"{job.dir}/job.log")
    stream.poll_s = 0.05
    lines = list(stream.follow(until=lambda: finished(target, job) is not None))
    assert lines == ["line 1", "line 2", "line 3"]


def test_metrics_of_a_real_job_parse(target: Target) -> None:
    job = spawn(
        target,
        toy_command("--steps", "5", "--step-time", "0.01"),
        env=toy_env(target.run_dir()),
    )
    wait_for(lambda: finished(target, job))
    lines = target.executor.tail(f"{job.dir}/metrics.jsonl").poll()
    events = [json.loads(line)["event"] for line in lines]
    assert events[0] == "begin"
    assert events[-1] == "end"
    assert events.count("log") == 5
