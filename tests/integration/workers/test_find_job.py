"""A job found after its spawn's answer was lost (`workers.find_job.find_job`, used by a
launch delivered again, a spawn that failed without an answer, and `reconcile`'s
settling) is found by its mark among the target's processes, with its leader's start
time, on every executor: whatever it wrote in its run directory, it is followed and
cancelled as the spawn would have answered. Found by `job.pid` alone, as before, a
job that forged `exit_code` was recorded succeeded while it ran, one with a link in
place of `exit_code` could never be cancelled, and one that replaced `job.pid` with a
directory left its run `preparing` for ever (the chaos campaign, bench/chaos.py)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from bench.harness.processes import job_processes, processes_carrying
from schemas import JobCommand, JobStatus
from schemas.protocol import EXIT_FILE, MARK_ENV, PID_FILE, RUN_ID_ENV, new_mark
from workers.executors import ProtocolError
from workers.find_job import find_job

from ...conftest import Target, wait_for

pytestmark = pytest.mark.slow

# Forges its end, replaces `job.pid` with a directory, puts a link in place of
# `cancelled`'s neighbour `exit_code` later, and starts a process in a session of its
# own (older than nothing of the job: the wrapper stays the oldest leader).
HOSTILE = """PATH=/usr/bin:/bin
setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
sleep 0.3
rm -f job.pid; mkdir job.pid
echo 0 > exit_code
while :; do sleep 1; done
"""


@pytest.mark.parametrize("forged", ["exit-code", "exit-code-link"])
def test_a_job_found_again_is_found_by_its_mark_whatever_it_wrote(
    target: Target, forged: str
) -> None:
    mark = f"found-{target.kind}-{forged}"
    script = HOSTILE
    if forged == "exit-code-link":
        script = script.replace("echo 0 > exit_code", "ln -s /dev/zero exit_code")
    run_dir = target.run_dir(mark)
    spawned = target.executor.spawn(
        JobCommand(dir=run_dir, script=script, env={"RUNWARDEN_RUN_ID": mark})
    )
    wait_for((Path(run_dir) / PID_FILE).is_dir, timeout_s=10)
    wait_for(
        lambda: (Path(run_dir) / EXIT_FILE).is_symlink() or (Path(run_dir) / EXIT_FILE).exists()
    )
    assert len(job_processes(mark)) >= 3  # the wrapper, the job, the escaped loop

    # Without the mark, only `job.pid` tells, and the job made it a directory.
    with pytest.raises(ProtocolError):
        find_job(target.executor, run_dir)

    job = find_job(target.executor, run_dir, mark)
    assert job is not None
    assert (job.pid, job.start, job.mark) == (spawned.pid, spawned.start, mark)
    assert job.start is not None
    assert target.executor.status(job) is JobStatus.RUNNING  # not exited 0, not lost
    target.executor.cancel(job)
    assert target.executor.status(job) is JobStatus.CANCELLED
    assert job_processes(mark) == []  # the escaped loop too: swept by its mark


def test_a_job_that_ended_is_found_by_its_job_pid_and_keeps_its_mark(target: Target) -> None:
    mark = f"ended-{target.kind}"
    run_dir = target.run_dir(mark)
    spawned = target.executor.spawn(
        JobCommand(dir=run_dir, script="exit 4", env={"RUNWARDEN_RUN_ID": mark})
    )
    wait_for((Path(run_dir) / EXIT_FILE).exists, timeout_s=10)
    wait_for(lambda: job_processes(mark) == [], timeout_s=10)
    job = find_job(target.executor, run_dir, mark)
    assert job is not None
    assert (job.pid, job.start, job.mark) == (spawned.pid, None, mark)
    assert target.executor.status(job) == JobStatus.exited(4)


ESCAPING = """PATH=/usr/bin:/bin
setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
while :; do sleep 1; done
"""


def test_two_runs_of_one_id_are_told_apart_by_their_marks(target: Target) -> None:
    """Two services on one machine gave two runs the same id in the same second: each
    job carries its own mark (`RUNWARDEN_MARK`, random per run), so finding one never
    finds the other, and cancelling one (its group, then every process carrying its
    mark: here a loop in a session of its own) leaves the other whole. With the run id
    as the mark (before marks), that cancel swept both escaped loops."""
    run_id = "20261202-010000-abcde-same"
    marks = {name: new_mark() for name in ("one", "two")}
    carrying = {name: f"{MARK_ENV}={mark}" for name, mark in marks.items()}
    jobs = {}
    try:
        for name, mark in marks.items():
            run_dir = target.run_dir(f"{name}-{run_id}")
            jobs[name] = target.executor.spawn(
                JobCommand(dir=run_dir, script=ESCAPING, env={RUN_ID_ENV: run_id, MARK_ENV: mark})
            )
            assert jobs[name].mark == mark
        # Each: the wrapper, the job's shell, the escaped loop (and their sleeps).
        wait_for(lambda: all(len(processes_carrying(e)) >= 3 for e in carrying.values()), 10)
        assert len(job_processes(run_id)) >= 6  # one id: both runs' processes

        for name, mark in marks.items():
            found = find_job(target.executor, jobs[name].dir, mark)
            assert found is not None
            assert (found.pid, found.start) == (jobs[name].pid, jobs[name].start)

        target.executor.cancel(jobs["one"])
        assert target.executor.status(jobs["one"]) is JobStatus.CANCELLED
        assert processes_carrying(carrying["one"]) == []
        assert len(processes_carrying(carrying["two"])) >= 3  # untouched, its escaped loop too
        assert target.executor.status(jobs["two"]) is JobStatus.RUNNING
    finally:
        for job in jobs.values():
            target.executor.cancel(job)
        for pid in processes_carrying(f"{RUN_ID_ENV}={run_id}"):  # whatever a failure left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert processes_carrying(carrying["two"]) == []
