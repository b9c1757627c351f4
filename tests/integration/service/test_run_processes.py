"""A run's processes, with the whole service (redis-server, a Celery worker, beat) and
real jobs on this machine: a scheduler's signal to every process of the job is the
job's (the run is `stopped`, `preempted`, and continued with `--on-preempt resume`,
also when the command is a shell script whose shell would have died of it first), and
a job's processes end with the run (its leftovers counted), or keep it running with
`wait_for_all` until they end or it is cancelled, on this machine and on an SSH
target (a real sshd on loopback). Nothing of an ended run is left."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, ssh_target
from bench.harness.processes import job_processes, read_proc
from bench.harness.sshd import SshServer
from schemas import RunRecord, RunState, SnapshotReason
from schemas.auth import WORKER
from schemas.chain import OnPreempt, continuation_key
from schemas.events import LaunchSpec
from schemas.idempotency import owned_launch_key
from schemas.protocol import JOB_LOG
from workers.executors import quote

from ...conftest import wait_for

TOY = Path(__file__).resolve().parents[3] / "examples" / "toy_trainer.py"
LEAVER = "sh -c 'sleep 60 & echo started'"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, sshd: SshServer) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("processes")
    with running_pipeline(tmp) as running:
        workdir = tmp / "ssh-work"
        workdir.mkdir()
        running.api.add_target(ssh_target(sshd, workdir))
        try:
            yield running
        finally:
            running.kill_jobs()


def launch(pipeline: Pipeline, command: str, target: str = "local", **fields: object) -> RunRecord:
    spec = LaunchSpec(target=target, command=command, **fields)  # type: ignore[arg-type]
    return pipeline.api.launch(spec, wait_s=60)


def nothing_left(run_id: str) -> bool:
    return job_processes(run_id) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
def test_a_signal_to_the_group_of_a_shell_script_stops_and_continues_the_run(
    pipeline: Pipeline, signum: int
) -> None:
    # A shell script, not one command: before, its `sh -c` died of the group's signal
    # before the trainer saved, and its 143 (138) made the run failed, never continued.
    trainer = f"{quote(sys.executable)} -u {quote(str(TOY))} --steps 100000 --step-time 0.05"
    run = launch(pipeline, f"{trainer}; echo trained", on_preempt=OnPreempt())
    pipeline.wait_step(run.id, 3)
    assert run.job is not None
    os.killpg(run.job.pid, signum)  # the whole group, as a scheduler signals it
    ended = pipeline.wait_state(run.id)
    assert ended.state is RunState.STOPPED, (ended, pipeline.logs())
    assert ended.snapshot is not None
    assert ended.snapshot.reason is SnapshotReason.PREEMPTED
    assert "trained" in (Path(run.remote_dir) / JOB_LOG).read_text()
    found = wait_for(
        lambda: pipeline.api.store.launches.launch(
            owned_launch_key(WORKER, continuation_key(run.id))
        ),
        60,
    )
    following = pipeline.api.get_run(str(found))
    assert following.resumed_from == run.id
    started = wait_for(lambda: pipeline.api.get_run(following.id).job is not None, 60)
    assert started, pipeline.logs()
    pipeline.api.cancel(following.id)
    assert nothing_left(run.id)
    assert wait_for(lambda: nothing_left(following.id), 15)


@pytest.mark.parametrize("target", ["local", "ssh"])
def test_the_leftover_processes_end_with_the_run(pipeline: Pipeline, target: str) -> None:
    # Before: recorded succeeded while `sleep 60` ran on, unsupervised.
    run = launch(pipeline, LEAVER, target)
    ended = pipeline.wait_state(run.id, 30)
    assert ended.state is RunState.SUCCEEDED, (ended, pipeline.logs())
    assert ended.message == "1 leftover process ended"
    assert nothing_left(run.id)


def test_with_wait_for_all_the_run_runs_until_cancelled(pipeline: Pipeline) -> None:
    run = launch(pipeline, LEAVER, wait_for_all=True)
    assert run.wait_for_all
    log = Path(run.remote_dir) / JOB_LOG
    wait_for(lambda: "started" in log.read_text(), 10)
    time.sleep(1.5)  # three follow periods after its main process ended
    assert pipeline.api.get_run(run.id).state is RunState.RUNNING
    assert any(b"sleep" in read_proc(f"/proc/{p}/cmdline") for p in job_processes(run.id))
    cancelled = pipeline.api.cancel(run.id)
    assert cancelled.state is RunState.CANCELLED, cancelled
    assert nothing_left(run.id)
