"""Stop -> resume -> stop with the real Hugging Face Trainer (a tiny GPT-2 built from a
config, on the CPU, no download) through the whole service: real Redis, Celery worker
and beat. The first stop is a cloud's preemption notice (GCP's metadata server,
emulated on loopback as GCP documents it: `bench/harness/fakecloud.py`): the watcher
writes the `preempted` request and the Trainer saves at its next step; the second is
asked through the API. Each stop's checkpoint comes home verified; the resume uploads
it into the new run and the Trainer continues the global step from it (the Trainer
loads the model, optimizer and scheduler that came home), which the final
checkpoint's `trainer_state.json` shows. (`from_pretrained` of the callback's
checkpoint is test_runwarden_hf.py's; a resume of a resumed run is the toy trainer's,
in test_policies_resume.py, and a notice's continuation on another target is
test_chain.py's: the chain of resumes is the service's, not the Trainer's.)"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.fakecloud import FakeCloud
from bench.harness.notice_env import running
from bench.harness.pipeline import Pipeline, running_pipeline
from schemas import ArtifactsPhase, RunRecord, RunState, SnapshotReason
from schemas.events import LaunchSpec
from schemas.protocol import SNAPSHOT_REQUEST
from workers.executors import quote

from ...conftest import ROOT, wait_for

pytestmark = pytest.mark.slow

HF_TRAINER = ROOT / "examples" / "hf_tiny_trainer.py"
START_TIMEOUT_S = 180.0  # importing torch and transformers on a loaded machine


@pytest.fixture
def gcp() -> Iterator[FakeCloud]:
    with running("gcp") as fake:
        yield fake


@pytest.fixture
def pipeline(tmp_path: Path, gcp: FakeCloud) -> Iterator[Pipeline]:
    # The proof can take a while: the Trainer saves a model and optimizer state.
    clocks = {
        "RUNWARDEN_PROOF_TIMEOUT_S": "60",
        "RUNWARDEN_END_TIMEOUT_S": "60",
        "RUNWARDEN_METADATA_GCP_URL": gcp.url,
        "RUNWARDEN_NOTICE_POLL_S": "0.5",
    }
    with running_pipeline(tmp_path, extra_env=clocks) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


def wait_retrieved(pipeline: Pipeline, run_id: str, timeout_s: float = 90.0) -> RunRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = pipeline.api.get_run(run_id)
        if run.artifacts is not None and run.artifacts.phase is ArtifactsPhase.DONE:
            return run
        time.sleep(0.3)
    run = pipeline.api.get_run(run_id)
    raise AssertionError(f"{run_id} not retrieved: {run}\n{pipeline.logs()}")


def stop_after(
    pipeline: Pipeline, run_id: str, step: int, notice: FakeCloud | None = None
) -> RunRecord:
    """Once the run passed `step`: `notice`'s preemption notice (withdrawn once the
    watcher asked), else a stop through the API; the run as it ended, retrieved."""
    pipeline.wait_step(run_id, step, timeout_s=START_TIMEOUT_S)
    if notice is None:
        pipeline.api.stop(run_id, asked_by="test")
    else:
        notice.notice_on()
        asked = Path(pipeline.api.get_run(run_id).remote_dir) / SNAPSHOT_REQUEST
        wait_for(asked.exists, timeout_s=30, interval_s=0.05)
        notice.notice_off()
    ended = pipeline.wait_state(run_id, timeout_s=120)
    assert ended.state is RunState.STOPPED, (ended, pipeline.logs())
    assert ended.snapshot is not None, (ended, pipeline.logs())
    return wait_retrieved(pipeline, run_id)


def test_a_notice_then_resume_then_stop_continues_the_global_step(
    pipeline: Pipeline, gcp: FakeCloud
) -> None:
    command = (
        f"exec {quote(sys.executable)} -u {quote(str(HF_TRAINER))} "
        "--steps 100000 --step-delay 0.1"
    )
    spec = LaunchSpec(target="local", command=command, name="hf", preemption="gcp")
    first = pipeline.api.launch(spec, wait_s=60)
    run = stop_after(pipeline, first.id, 3, notice=gcp)
    steps: list[int] = []
    assert run.snapshot is not None
    assert run.snapshot.reason is SnapshotReason.PREEMPTED
    assert run.preemption is not None
    assert run.preemption.notice is not None
    assert run.preemption.notice.source == "gcp-preempted"
    steps.append(run.snapshot.step)
    # The Trainer saved on the notice: a whole Hugging Face checkpoint at the step.
    checkpoint = Path(run.remote_dir) / run.snapshot.checkpoint
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == steps[0]
    resumed = pipeline.api.launch(pipeline.api.resume_spec(run.id), wait_s=60)
    assert resumed.resumed_from == run.id
    remote_checkpoint = Path(resumed.remote_dir) / f"output/checkpoint-{steps[-1]}"
    assert (remote_checkpoint / "trainer_state.json").is_file()  # uploaded
    run = stop_after(pipeline, resumed.id, steps[-1] + 3)
    assert run.snapshot is not None
    assert run.snapshot.step > steps[-1]
    log = (Path(resumed.remote_dir) / "job.log").read_text()
    assert "resuming from" in log
    steps.append(run.snapshot.step)
    # The final checkpoint, as it came home: its trainer state goes on from the first.
    home = pipeline.api.settings.artifacts_root / run.id / f"output/checkpoint-{steps[-1]}"
    state = json.loads((home / "trainer_state.json").read_text())
    assert state["global_step"] == steps[-1]
    logged = [entry["step"] for entry in state["log_history"] if "loss" in entry]
    assert logged[0] == 1, logged
    assert logged[-1] == steps[-1], logged
    assert steps[0] < steps[1]
