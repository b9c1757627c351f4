"""A DDP loop of one's own (examples/ddp_loop.py with `runwarden_loop.StopPoint`, two
ranks under torchrun, gloo on the CPU) through the whole service: a stop asked
through the API ends the run `stopped` with every rank stopped at the same step and
a checkpoint holding every rank's part that loads; the resume uploads it and the loop
goes on from that step. (Losses step for step against an uninterrupted run:
tests/integration/workers/jobside/test_runwarden_loop.py.)"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline
from bench.harness.ports import free_port
from schemas import ArtifactsPhase, RunRecord, RunState, SnapshotReason
from schemas.events import LaunchSpec
from workers.executors import quote

from ...conftest import ROOT, wait_for

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 120.0  # importing torch in two ranks on a loaded machine


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    clocks = {"RUNWARDEN_PROOF_TIMEOUT_S": "60", "RUNWARDEN_END_TIMEOUT_S": "60"}
    with running_pipeline(tmp_path_factory.mktemp("loop"), extra_env=clocks) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


def stopped(pipeline: Pipeline, run_id: str, after: int) -> RunRecord:
    """Stops the run once it passed step `after`; the run as it ended, retrieved."""
    pipeline.wait_step(run_id, after, timeout_s=START_TIMEOUT_S)
    pipeline.api.stop(run_id, asked_by="test")
    ended = pipeline.wait_state(run_id, timeout_s=120)
    assert ended.state is RunState.STOPPED, (ended, pipeline.logs()[-3000:])

    def retrieved() -> RunRecord | None:
        run = pipeline.api.get_run(run_id)
        done = run.artifacts is not None and run.artifacts.phase is ArtifactsPhase.DONE
        return run if done else None

    found = wait_for(retrieved, timeout_s=90)
    assert isinstance(found, RunRecord)
    return found


def every_rank_at(run: RunRecord) -> int:
    """The step both ranks stopped at (each says so in the log), the checkpoint's."""
    assert run.snapshot is not None
    log = (Path(run.remote_dir) / "job.log").read_text()
    steps = dict(re.findall(r"rank (\d) stopped at step (\d+)", log))
    assert sorted(steps) == ["0", "1"], log[-2000:]
    (step,) = {int(s) for s in steps.values()}
    assert run.snapshot.step == step
    checkpoint = Path(run.remote_dir) / run.snapshot.checkpoint
    import torch  # here: every test process collects this module, few run it

    for rank in (0, 1):
        assert torch.load(checkpoint / f"rank-{rank}.pt", weights_only=False)["step"] == step
    return step


def test_a_ddp_loop_stops_every_rank_at_one_step_and_resumes_from_it(pipeline: Pipeline) -> None:
    example = ROOT / "examples" / "ddp_loop.py"
    command = (
        f"exec {quote(sys.executable)} -m torch.distributed.run --nproc-per-node=2 "
        f"--master-port={free_port()} {quote(str(example))} --steps 100000 --step-time 0.1"
    )
    first = pipeline.api.launch(LaunchSpec(target="local", command=command, name="ddp"), wait_s=60)
    run = stopped(pipeline, first.id, 5)
    assert run.snapshot is not None
    assert run.snapshot.reason is SnapshotReason.REQUESTED
    step = every_rank_at(run)

    spec = pipeline.api.resume_spec(run.id)
    # A fresh rendezvous port: the first run's may not be free yet.
    spec = spec.model_copy(
        update={
            "command": re.sub(r"--master-port=\d+", f"--master-port={free_port()}", spec.command)
        }
    )
    resumed = pipeline.api.launch(spec, wait_s=60)
    assert resumed.resumed_from == run.id
    again = stopped(pipeline, resumed.id, step + 3)
    log = (Path(resumed.remote_dir) / "job.log").read_text()
    for rank in (0, 1):
        assert f"rank {rank} resuming from" in log, log[-2000:]
        assert f"rank {rank} step {step + 1} loss" in log
        assert f"rank {rank} step {step} loss" not in log  # on from the checkpoint
    assert every_rank_at(again) > step
