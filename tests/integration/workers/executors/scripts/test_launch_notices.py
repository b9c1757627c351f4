"""The preemption-notice watcher started by spawn beside the job (`JobCommand.preemption`),
against every executor (`target`: local, shell, ssh), with real detached processes and
the fake metadata services of `bench/harness/fakecloud.py` on loopback (they emulate each
cloud's documented behaviour: the real services cannot be reached from here). The
watcher asks the toy trainer for its `preempted` snapshot by itself, outlives the
process that spawned it, stays out of the job's process group, never has the job's
secrets, and ends with the job or its run directory; the launcher clears a stale
notice."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bench.harness.fakecloud import FakeCloud
from bench.harness.notice_env import running
from schemas import JobCommand, JobId, JobStatus
from schemas.protocol import (
    NOTICE_FILE,
    NOTICE_PID_FILE,
    NOTICE_STATE_FILE,
    SNAPSHOT_FILE,
    SNAPSHOT_REQUEST,
)
from workers.executors import LocalExecutor, ScriptExecutor, parse_notice
from workers.executors.notices import notice_watch_script
from workers.executors.transport import LocalTransport

from .....conftest import Target, process_alive, toy_command, toy_env, wait_for

POLL_S = 0.2
CLOUDS = ("aws", "gcp", "azure")
SOURCES = {"aws": "aws-spot", "gcp": "gcp-preempted", "azure": "azure-preempt"}
HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>* x"
SECRET = "s3cr3t-notice $(touch PWNED) 'q'"


@pytest.fixture(params=CLOUDS)
def cloud(request: pytest.FixtureRequest) -> Iterator[FakeCloud]:
    with running(request.param) as fake:
        yield fake


@pytest.fixture
def gcp() -> Iterator[FakeCloud]:
    with running("gcp") as fake:
        yield fake


def watch_fields(fake: FakeCloud) -> dict[str, object]:
    return {
        "preemption": fake.name,
        "metadata_urls": {fake.name: fake.url},
        "notice_poll_s": POLL_S,
    }


def spawn(target: Target, fake: FakeCloud, script: str, name: str = "run", **kw: object) -> JobId:
    command = JobCommand(
        dir=target.run_dir(name),
        script=script,
        **watch_fields(fake),
        **kw,
    )
    return target.executor.spawn(command)


def state(job: JobId) -> str:
    path = Path(job.dir) / NOTICE_STATE_FILE
    return path.read_text().strip() if path.exists() else ""


def watcher_pid(job: JobId) -> int:
    """The watcher's pid, once it said it watches."""
    wait_for(lambda: state(job).startswith("watching"), timeout_s=15)
    return int((Path(job.dir) / NOTICE_PID_FILE).read_text())


def watchers_of(port: int) -> list[int]:
    """Live processes whose command line names the fake's port: the watcher (its script
    holds the URL), its waiting parent, its loops and its requests."""
    needle = f"127.0.0.1:{port}".encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, ValueError):
            if needle in cmdline.read_bytes() and process_alive(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
    return found


def finished(target: Target, job: JobId) -> JobStatus | None:
    status = target.executor.status(job)
    return status if status.is_finished else None


# --- it asks -----------------------------------------------------------------------


def test_a_notice_makes_the_toy_trainer_save(target: Target, cloud: FakeCloud) -> None:
    job = spawn(
        target,
        cloud,
        toy_command("--steps", "100000", "--step-time", "0.05"),
        env=toy_env(target.run_dir()),
    )
    pid = watcher_pid(job)
    assert state(job) == f"watching {cloud.name} with curl"
    assert not (Path(job.dir) / SNAPSHOT_REQUEST).exists()
    cloud.notice_on()
    assert wait_for(lambda: finished(target, job), timeout_s=30) == JobStatus.exited(0)
    assert (Path(job.dir) / SNAPSHOT_REQUEST).read_text() == "preempted"
    notice = parse_notice((Path(job.dir) / NOTICE_FILE).read_bytes())
    assert notice.source == SOURCES[cloud.name]
    proof = json.loads((Path(job.dir) / SNAPSHOT_FILE).read_text())
    assert proof["reason"] == "preempted"
    assert (Path(job.dir) / proof["checkpoint"]).is_dir()
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)
    assert state(job) == f"done: recorded the {SOURCES[cloud.name]} notice"
    wait_for(lambda: not watchers_of(cloud.port), timeout_s=3)


def test_the_watcher_asks_even_when_its_spawner_died(target: Target, gcp: FakeCloud) -> None:
    # No worker, no Redis: the process that spawned the job is gone at once.
    job = target.spawn_from_a_dying_process("sleep 60", **watch_fields(gcp))
    pid = watcher_pid(job)
    gcp.notice_on()
    request = Path(job.dir) / SNAPSHOT_REQUEST
    wait_for(request.exists, timeout_s=10)
    assert request.read_text() == "preempted"
    fresh = target.make()
    assert fresh.status(job) == JobStatus.RUNNING  # `sleep` answers no request
    fresh.cancel(job)
    assert fresh.status(job) == JobStatus.CANCELLED
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)


def test_the_watcher_is_outside_the_job_group_and_ends_with_a_cancel(
    target: Target, gcp: FakeCloud
) -> None:
    job = spawn(target, gcp, "sleep 60")
    pid = watcher_pid(job)
    assert os.getpgid(pid) != job.pid
    assert os.getsid(pid) == pid  # a session of its own, as the watchdog
    target.executor.cancel(job)  # signals the job's group only
    assert target.executor.status(job) == JobStatus.CANCELLED
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)
    assert state(job) == "done: the job ended"
    assert not (Path(job.dir) / SNAPSHOT_REQUEST).exists()
    assert not (Path(job.dir) / NOTICE_FILE).exists()
    wait_for(lambda: not watchers_of(gcp.port), timeout_s=3)


def test_the_watcher_ends_when_the_run_directory_goes(target: Target, gcp: FakeCloud) -> None:
    job = spawn(target, gcp, "sleep 60")
    pid = watcher_pid(job)
    shutil.rmtree(job.dir)
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)
    wait_for(lambda: not watchers_of(gcp.port), timeout_s=3)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, 9)


def test_a_stale_notice_is_cleared_at_the_spawn(target: Target, gcp: FakeCloud) -> None:
    run = Path(target.run_dir())
    (run / ".runwarden").mkdir(parents=True)
    stale = {NOTICE_FILE: "{}", NOTICE_STATE_FILE: "done: old\n", NOTICE_PID_FILE: "1\n"}
    for name, text in stale.items():
        (run / name).write_text(text)
    (run / SNAPSHOT_REQUEST).write_text("preempted")
    job = target.executor.spawn(JobCommand(dir=str(run), script="sleep 60"))  # no watcher
    for name in (*stale, SNAPSHOT_REQUEST):
        assert not (run / name).exists(), name
    target.executor.cancel(job)
    for name, text in stale.items():
        (run / name).write_text(text)
    job = spawn(target, gcp, "sleep 60")  # a new watcher: its own files only
    pid = watcher_pid(job)
    assert (run / NOTICE_PID_FILE).read_text() == f"{pid}\n"
    assert not (run / NOTICE_FILE).exists()
    target.executor.cancel(job)
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)


def test_no_watcher_without_preemption(target: Target, gcp: FakeCloud) -> None:
    job = target.executor.spawn(JobCommand(dir=target.run_dir(), script="sleep 60"))
    time.sleep(1)
    assert not (Path(job.dir) / NOTICE_STATE_FILE).exists()
    assert not (Path(job.dir) / NOTICE_PID_FILE).exists()
    assert gcp.seen() == []
    target.executor.cancel(job)


def test_a_hostile_run_directory_and_the_secrets(target: Target, gcp: FakeCloud) -> None:
    job = spawn(target, gcp, "sleep 60", HOSTILE_DIR, secrets={"HF_TOKEN": SecretStr(SECRET)})
    assert Path(job.dir).name == HOSTILE_DIR
    pid = watcher_pid(job)
    assert SECRET.encode() in Path(f"/proc/{job.pid}/environ").read_bytes()
    for process in [pid, *watchers_of(gcp.port)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            assert SECRET.encode() not in Path(f"/proc/{process}/environ").read_bytes()
            assert SECRET.encode() not in Path(f"/proc/{process}/cmdline").read_bytes()
    gcp.notice_on()
    request = Path(job.dir) / SNAPSHOT_REQUEST
    wait_for(request.exists, timeout_s=10)
    assert request.read_text() == "preempted"
    target.executor.cancel(job)
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)
    assert not list(target.workdir.rglob("PWNED"))
    assert not Path("PWNED").exists()
    assert not Path("/PWNED").exists()


# --- what the target lacks, and a reused pid ------------------------------------------


def path_without(root: Path, *missing: str) -> str:
    """A PATH of one directory holding links to every program of /usr/bin and /bin
    but `missing`."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for program in Path(folder).iterdir():
            name = program.name
            if name not in missing and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(program)
    return str(bin_dir)


@pytest.mark.parametrize("kind", ["local", "shell"])
def test_a_target_without_curl_or_wget_says_so(
    kind: str, tmp_path: Path, gcp: FakeCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The launcher and so the watcher get this process's PATH (a local target).
    monkeypatch.setenv("PATH", path_without(tmp_path, "curl", "wget"))
    workdir = tmp_path / "work"
    executor = (
        LocalExecutor(workdir)
        if kind == "local"
        else ScriptExecutor(LocalTransport(), str(workdir))
    )
    command = JobCommand(dir=str(workdir / "run"), script="sleep 60", **watch_fields(gcp))
    job = executor.spawn(command)
    path = Path(job.dir) / NOTICE_STATE_FILE
    wait_for(path.exists, timeout_s=10)
    assert path.read_text() == "unavailable: neither curl nor wget is installed\n"
    assert executor.status(job) == JobStatus.RUNNING  # the job is not disturbed
    executor.cancel(job)


def test_a_reused_pid_is_not_the_job(tmp_path: Path, gcp: FakeCloud) -> None:
    # Given the job's pid and a start time that is not its leader's, the watcher
    # knows the job is gone (its pid went to another process) and ends at once.
    run = tmp_path / "run"
    run.mkdir()
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        script = notice_watch_script(str(run), "gcp", {"gcp": gcp.url}, POLL_S)
        done = subprocess.run(
            ["sh", "-c", script.text, "rw-notice", *script.args, str(other.pid), "1"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert (run / NOTICE_STATE_FILE).read_text() == "done: the job ended\n"
        assert gcp.seen() == []
    finally:
        other.kill()
        other.wait()
