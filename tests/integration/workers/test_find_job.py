"""A job found after its spawn's answer was lost (`workers.find_job.find_job`, used by a
launch delivered again, a spawn that failed without an answer, and `reconcile`'s
settling) is found by its mark among the target's processes, with its leader's start
time, on every executor: whatever it wrote in its run directory, it is followed and
cancelled as the spawn would have answered. Found by `job.pid` alone, as before, a
job that forged `exit_code` was recorded succeeded while it ran, one with a link in
place of `exit_code` could never be cancelled, and one that replaced `job.pid` with a
directory left its run `preparing` for ever (the chaos campaign, bench/chaos.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.processes import job_processes
from schemas import JobCommand, JobStatus
from schemas.protocol import EXIT_FILE, PID_FILE
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
