"""The on-target watchdog started by spawn beside the job, against every executor
(`target`: local, shell, ssh), with real detached processes: it asks for the
`deadline` snapshot by itself, keeps a request already there, exits with the job,
and stays out of the job's process group."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from schemas import JobCommand, JobId, JobStatus
from schemas.protocol import SNAPSHOT_FILE, SNAPSHOT_REQUEST
from workers.executors import InvalidArgument
from workers.executors.scripts import WATCHDOG_PID_FILE

from .....conftest import Target, process_alive, toy_command, toy_env, wait_for

POLL_S = 0.2
HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>* x"
SECRET = "s3cr3t-watchdog $(touch PWNED) 'q'"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def spawn(target: Target, script: str, name: str = "run", **kw: object) -> JobId:
    command = JobCommand(dir=target.run_dir(name), script=script, **kw)  # type: ignore[arg-type]
    return target.executor.spawn(command)


def watchdog_pid(job: JobId) -> int:
    """The watchdog's pid, once it recorded it."""
    path = Path(job.dir) / WATCHDOG_PID_FILE
    text = wait_for(lambda: path.exists() and path.read_text().strip())
    return int(str(text))


def watchdogs_of(run_dir: str) -> list[int]:
    """Live watchdog processes (and their waiting parents) whose script names
    `run_dir`: found by their command line, which holds the script."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            data = cmdline.read_bytes()
            if b"rw_after=" in data and run_dir.encode() in data:
                pid = int(cmdline.parent.name)
                if process_alive(pid):
                    found.append(pid)
    return found


def finished(target: Target, job: JobId) -> JobStatus | None:
    status = target.executor.status(job)
    return status if status.is_finished else None


def gone_within(pid: int, limit_s: float) -> float:
    """Seconds until `pid` is gone (exited and reaped, or a zombie); fails after
    `limit_s`."""
    started = time.monotonic()
    wait_for(lambda: not process_alive(pid), timeout_s=limit_s, interval_s=0.02)
    return time.monotonic() - started


# --- it asks -----------------------------------------------------------------------


def test_the_watchdog_asks_a_toy_trainer_for_its_deadline_snapshot(target: Target) -> None:
    started = time.monotonic()
    job = spawn(
        target,
        toy_command("--steps", "100000", "--step-time", "0.05"),
        env=toy_env(target.run_dir()),
        deadline_request_after_s=1.5,
        watchdog_poll_s=POLL_S,
    )
    request = Path(job.dir) / SNAPSHOT_REQUEST
    wait_for(request.exists, timeout_s=15, interval_s=0.02)
    took = time.monotonic() - started
    assert 1.2 < took < 8, took  # ms clock (GNU date); slack for a loaded machine
    assert request.read_text() == "deadline"
    # The trainer saw it, saved a checkpoint, wrote the proof and ended: the watchdog
    # ends with it.
    assert wait_for(lambda: finished(target, job), timeout_s=30) == JobStatus.exited(0)
    proof = json.loads((Path(job.dir) / SNAPSHOT_FILE).read_text())
    assert proof["reason"] == "deadline"
    assert (Path(job.dir) / proof["checkpoint"]).is_dir()
    wait_for(lambda: not watchdogs_of(job.dir), timeout_s=POLL_S + 2)
    assert sorted(p.name for p in Path(job.dir).iterdir() if "rw-tmp" in p.name) == []


def test_the_watchdog_asks_even_when_its_spawner_died(target: Target) -> None:
    # No worker, no Redis: the process that spawned the job is gone at once.
    job = target.spawn_from_a_dying_process(
        "sleep 60", deadline_request_after_s=1.0, watchdog_poll_s=0.2
    )
    request = Path(job.dir) / SNAPSHOT_REQUEST
    wait_for(request.exists, timeout_s=10)
    assert request.read_text() == "deadline"
    fresh = target.make()
    assert fresh.status(job) == JobStatus.RUNNING
    fresh.cancel(job)
    assert fresh.status(job) == JobStatus.CANCELLED


def test_a_request_already_there_is_kept(target: Target) -> None:
    run = target.workdir / "run"
    run.mkdir()
    # (spawn clears a request left before it: this one comes after, before the fire)
    job = spawn(target, "sleep 60", deadline_request_after_s=1.5, watchdog_poll_s=POLL_S)
    target.executor.put_file(str(run / SNAPSHOT_REQUEST), "cost")
    pid = watchdog_pid(job)
    time.sleep(2.5)  # well past its fire time
    assert process_alive(pid)  # it fired, found the request, and waits for the job
    assert (run / SNAPSHOT_REQUEST).read_text() == "cost"
    # A request that comes after the fire time is not touched either.
    target.executor.put_file(str(run / SNAPSHOT_REQUEST), "requested")
    time.sleep(3 * POLL_S)
    assert (run / SNAPSHOT_REQUEST).read_text() == "requested"
    target.executor.cancel(job)
    assert gone_within(pid, POLL_S + 1.5) < POLL_S + 1.5
    assert sorted(os.listdir(run)) == sorted(
        [".runwarden", "cancelled", "cancelling", "job.log", "job.pid", SNAPSHOT_REQUEST]
    )


# --- it exits with the job ---------------------------------------------------------


@pytest.mark.parametrize("ending", ["exit", "cancel"])
def test_the_watchdog_exits_with_the_job_and_writes_nothing_after(
    target: Target, ending: str
) -> None:
    # Its fire time comes after the job's end: it must never write. (3 s: a loaded
    # machine stretches the job's 0.8 s and its wrapper's end well past a second.)
    script = "sleep 0.8; exit 3" if ending == "exit" else "sleep 60"
    job = spawn(target, script, deadline_request_after_s=3.0, watchdog_poll_s=POLL_S)
    pid = watchdog_pid(job)
    assert process_alive(pid)
    if ending == "exit":
        assert wait_for(lambda: finished(target, job)) == JobStatus.exited(3)
    else:
        target.executor.cancel(job)
        assert target.executor.status(job) == JobStatus.CANCELLED
    took = gone_within(pid, POLL_S + 1.5)
    assert took < POLL_S + 1.0, took
    # Its waiting parent went too (a loaded machine reaps it a moment after the watchdog).
    wait_for(lambda: not watchdogs_of(job.dir), timeout_s=POLL_S + 2)
    time.sleep(2.5)  # past the fire time
    assert not (Path(job.dir) / SNAPSHOT_REQUEST).exists()


def test_the_watchdog_is_outside_the_job_group(target: Target) -> None:
    job = spawn(target, "sleep 60", deadline_request_after_s=600, watchdog_poll_s=POLL_S)
    pid = watchdog_pid(job)
    # A session and process group of its own: never counted as the job, never
    # signalled with it.
    assert os.getsid(pid) == pid
    assert os.getpgid(pid) == pid
    assert pid != job.pid
    assert os.getpgid(job.pid) == job.pid
    assert target.executor.status(job) == JobStatus.RUNNING
    started = time.monotonic()
    target.executor.cancel(job)
    assert time.monotonic() - started < 5
    assert target.executor.status(job) == JobStatus.CANCELLED
    assert not group_alive(job.pid)
    gone_within(pid, POLL_S + 1.5)


def test_the_job_group_gone_without_markers_ends_the_watchdog(target: Target) -> None:
    job = spawn(target, "sleep 60", deadline_request_after_s=600, watchdog_poll_s=POLL_S)
    pid = watchdog_pid(job)
    os.killpg(job.pid, 9)
    assert wait_for(lambda: finished(target, job)) == JobStatus.LOST
    gone_within(pid, POLL_S + 1.5)


# --- no watchdog, bad values, hostile names, secrets -------------------------------


def test_no_watchdog_without_a_deadline(target: Target) -> None:
    run = target.workdir / "run"
    (run / ".runwarden").mkdir(parents=True)
    (run / WATCHDOG_PID_FILE).write_text("12345\n")  # stale, from an earlier spawn
    job = spawn(target, "sleep 60")
    time.sleep(0.5)
    assert not (run / WATCHDOG_PID_FILE).exists()
    assert watchdogs_of(job.dir) == []
    target.executor.cancel(job)
    assert not (run / SNAPSHOT_REQUEST).exists()


@pytest.mark.parametrize(
    ("after_s", "poll_s"),
    [(float("nan"), 1.0), (float("inf"), 1.0), (0.0, 1.0), (-1.0, 1.0), (2e9, 1.0),
     (1.0, 0.0), (1.0, float("nan"))],
)  # fmt: skip
def test_bad_watchdog_times_start_nothing(target: Target, after_s: float, poll_s: float) -> None:
    with pytest.raises(ValueError, match=r"deadline_request_after_s|watchdog_poll_s"):
        JobCommand(
            dir=target.run_dir(),
            script="echo x",
            deadline_request_after_s=after_s,
            watchdog_poll_s=poll_s,
        )
    # Built without validation: the executor refuses before anything runs.
    command = JobCommand.model_construct(
        dir=target.run_dir(),
        script="echo started > started",
        env={},
        secrets={},
        container=None,
        deadline_request_after_s=after_s,
        watchdog_poll_s=poll_s,
    )
    with pytest.raises(InvalidArgument, match=r"after_s|poll_s"):
        target.executor.spawn(command)
    time.sleep(0.2)
    assert not (target.workdir / "run").exists()


def test_a_hostile_run_directory(target: Target) -> None:
    job = spawn(
        target, "sleep 60", HOSTILE_DIR, deadline_request_after_s=0.4, watchdog_poll_s=POLL_S
    )
    assert Path(job.dir).name == HOSTILE_DIR
    request = Path(job.dir) / SNAPSHOT_REQUEST
    wait_for(request.exists, timeout_s=10)
    assert request.read_text() == "deadline"
    pid = watchdog_pid(job)
    target.executor.cancel(job)
    gone_within(pid, POLL_S + 1.5)
    assert not list(target.workdir.rglob("PWNED"))
    assert not Path("PWNED").exists()
    assert not Path("/PWNED").exists()


def test_the_secrets_stay_out_of_the_watchdog(target: Target) -> None:
    job = spawn(
        target,
        "sleep 60",
        secrets={"HF_TOKEN": SecretStr(SECRET)},
        deadline_request_after_s=600,
        watchdog_poll_s=POLL_S,
    )
    pid = watchdog_pid(job)
    assert SECRET.encode() in Path(f"/proc/{job.pid}/environ").read_bytes()
    for process in [pid, *watchdogs_of(job.dir)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            assert SECRET.encode() not in Path(f"/proc/{process}/environ").read_bytes()
            assert SECRET.encode() not in Path(f"/proc/{process}/cmdline").read_bytes()
    target.executor.cancel(job)
