"""Slurm targets through the real service (bench/harness/pipeline.py: redis-server,
Celery worker and beat) and a real single-node Slurm cluster (bench/harness/slurm.py):
a run launched with `sbatch`, followed, stopped with its proof and checkpoint; a run
held pending stopped before it starts; a run whose Slurm time limit comes ends
`stopped` on the `deadline` snapshot Slurm's warning asked for; cancel through
`scancel`."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline
from bench.harness.slurm import SlurmCluster
from schemas import RunRecord, RunState, SnapshotReason, TargetConfig
from schemas.auth import WORKER
from schemas.chain import OnPreempt, continuation_key
from schemas.events import LaunchSpec
from schemas.idempotency import owned_launch_key
from schemas.targets import SlurmOptions
from workers.executors import quote

from ...conftest import TOY_TRAINER, wait_for

pytestmark = pytest.mark.slow


@dataclass
class Service:
    pipeline: Pipeline
    slurm: SlurmCluster
    source: Path


@pytest.fixture(scope="module")
def service(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    base = tmp_path_factory.mktemp("slurm-service")
    source = base / "src"
    source.mkdir()
    shutil.copy(TOY_TRAINER, source / "toy_trainer.py")
    with running_pipeline(base) as pipeline:
        common = {"kind": "local", "run_as": "root", "upload_roots": (str(source),)}
        pipeline.api.add_target(
            TargetConfig(
                name="cluster", workdir=str(base / "shared"), slurm=SlurmOptions(), **common
            )  # type: ignore[arg-type]
        )
        # One minute of time limit, warned 55 s before: Slurm sends the warning at
        # its next check (every 30 s or so), long before the limit.
        short = SlurmOptions(sbatch_args=("--time=1",), signal_lead_s=55)
        pipeline.api.add_target(
            TargetConfig(name="short", workdir=str(base / "shared"), slurm=short, **common)  # type: ignore[arg-type]
        )
        # Its jobs take every CPU of the node in the preemptible partition: a job of
        # `high` preempts them (SIGTERM, 20 s of grace: bench/harness/slurm.py).
        low = SlurmOptions(partition="low", sbatch_args=(f"--cpus-per-task={slurm.cpus}",))
        pipeline.api.add_target(
            TargetConfig(name="preemptible", workdir=str(base / "shared"), slurm=low, **common)  # type: ignore[arg-type]
        )
        try:
            yield Service(pipeline, slurm, source)
        finally:
            slurm.cancel_all()


def toy(service: Service, target: str, *args: str) -> LaunchSpec:
    words = " ".join(quote(a) for a in ["--step-time", "0.05", "--steps", "100000", *args])
    command = f"exec {quote(sys.executable)} -u toy_trainer.py {words}"
    return LaunchSpec(target=target, command=command, upload=service.source)


def test_a_run_on_slurm_is_followed_and_stopped_with_its_checkpoint(service: Service) -> None:
    api = service.pipeline.api
    run = api.launch(toy(service, "cluster"), wait_s=60)
    assert run.job is not None
    assert run.job.slurm is not None
    assert service.slurm.wait_state(str(run.job.slurm), {"RUNNING"}) == "RUNNING"
    service.pipeline.wait_step(run.id, 5, timeout_s=30)
    # What Slurm says of the job is in the run's record (`show` prints it).
    said = f"Slurm job {run.job.slurm}: RUNNING"
    wait_for(lambda: api.get_run(run.id).scheduler == said, 10)
    api.stop(run.id)
    done, _ = service.pipeline.wait_terminal(run.id, timeout_s=60)
    assert done.state is RunState.STOPPED, done
    assert done.snapshot is not None
    assert done.snapshot.reason is SnapshotReason.REQUESTED
    assert (Path(done.remote_dir) / done.snapshot.checkpoint).is_dir()
    assert service.slurm.state(str(run.job.slurm)) == "COMPLETED"
    lines = [entry.line for entry in api.store.follow.read_log(run.id)]
    assert any("step" in line for line in lines), lines[-5:]


def test_a_run_held_pending_is_stopped_before_it_starts(service: Service) -> None:
    slurm = service.slurm
    blocker = slurm.run(
        "sbatch", "--parsable", f"--cpus-per-task={slurm.cpus}", "--wrap", "sleep 300"
    ).strip()
    try:
        slurm.wait_state(blocker, {"RUNNING"})
        api = service.pipeline.api
        run = api.launch(toy(service, "cluster"), wait_s=60)
        assert run.job is not None
        assert slurm.state(str(run.job.slurm)) == "PENDING"
        wait_for(lambda: (api.get_run(run.id).scheduler or "").startswith("Slurm job"), 10)
        assert "PENDING" in (api.get_run(run.id).scheduler or "")
        asked = time.time()
        api.stop(run.id)
        done, ended = service.pipeline.wait_terminal(run.id, timeout_s=30)
        assert done.state is RunState.CANCELLED, done
        # At once, not at the proof deadline (6 s here): nothing of it ran to save.
        assert ended - asked < 5, ended - asked
        assert slurm.state(str(run.job.slurm)) == "CANCELLED"
        assert not (Path(done.remote_dir) / "job.log").exists()
    finally:
        slurm.run("scancel", blocker, check=False)


def test_slurms_time_limit_warning_ends_the_run_on_a_deadline_snapshot(service: Service) -> None:
    api = service.pipeline.api
    run = api.launch(toy(service, "short"), wait_s=60)
    done, _ = service.pipeline.wait_terminal(run.id, timeout_s=75)
    assert done.state is RunState.STOPPED, done
    assert done.snapshot is not None
    assert done.snapshot.reason is SnapshotReason.DEADLINE


def test_cancel_goes_through_scancel(service: Service) -> None:
    api = service.pipeline.api
    run = api.launch(toy(service, "cluster", "--ignore-sigterm"), wait_s=60)
    assert run.job is not None
    service.pipeline.wait_step(run.id, 2, timeout_s=30)
    done = api.cancel(run.id)
    wait_for(lambda: api.get_run(run.id).state is RunState.CANCELLED, 30)
    assert service.slurm.state(str(run.job.slurm)) in {"CANCELLED", "FAILED"}, done


def test_doctor_of_a_slurm_target(service: Service) -> None:
    report = service.pipeline.api.doctor("cluster")
    names = {check.name: check for check in report.checks}
    assert names["shared-workdir"].status == "ok", names["shared-workdir"]
    assert names["containment"].status == "warn"
    # Slurm contains its jobs: no cgroup of the worker's is offered or said missing.
    assert "cgroup" not in names
    assert names["job-user"].status == "warn"


def test_a_run_slurm_preempts_is_stopped_with_its_checkpoint_and_resumed(
    service: Service,
) -> None:
    api, slurm = service.pipeline.api, service.slurm
    spec = toy(service, "preemptible").model_copy(update={"on_preempt": OnPreempt()})
    first = api.launch(spec, wait_s=60)
    service.pipeline.wait_step(first.id, 3, timeout_s=30)
    high = slurm.run("sbatch", "--parsable", "-p", "high", "--wrap", "sleep 3").strip()
    try:
        ended = service.pipeline.wait_state(first.id, timeout_s=90)
        assert ended.state is RunState.STOPPED, (ended, service.pipeline.logs()[-3000:])
        assert ended.snapshot is not None
        assert ended.snapshot.reason is SnapshotReason.PREEMPTED
        assert ended.job is not None
        # Saved within its grace: Slurm did not have to kill it.
        # (Slurm may still be COMPLETING it a moment after the run's end is recorded.)
        slurm.wait_state(str(ended.job.slurm), {"PREEMPTED", "COMPLETED"})
        step = ended.snapshot.step
        second_id = wait_for(
            lambda: api.store.launches.launch(owned_launch_key(WORKER, continuation_key(first.id))),
            timeout_s=60,
        )
        second = wait_for(lambda: (r := api.get_run(str(second_id))).job and r, 60)
        assert isinstance(second, RunRecord)
        assert second.resumed_from == first.id
        assert second.job is not None
        assert second.job.slurm != ended.job.slurm  # a new submission
        # Queued behind the job that preempted it, then on from the checkpoint.
        service.pipeline.wait_step(second.id, step + 2, timeout_s=60)
        log = (Path(second.remote_dir) / "job.log").read_text()
        assert f"resuming from {second.remote_dir}/output/checkpoint-{step}" in log, log[-2000:]
    finally:
        slurm.run("scancel", high, check=False)
