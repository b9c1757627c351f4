"""`--on-preempt resume` through the whole service (real redis-server, Celery worker and
beat, a real sshd on loopback with strict known_hosts, the toy trainer): a run
preempted on the local target is resumed, with no person, on the SSH target from its
verified checkpoint, and its step goes on; the next preemption is past
`--max-preemptions` and is not resumed. (The Hugging Face Trainer saving on a GCP
notice and resuming from what came home is test_hf_resume.py's.)

The first preemption is a cloud's notice: the run watches GCP's metadata server
(emulated on loopback as GCP documents it, `bench/harness/fakecloud.py`), whose `preempted`
turns TRUE; the notice watcher writes the `preempted` request. The second is a SIGTERM
to the job's whole process group, as Kubernetes sends one to a pod: the job side turns
it into the same request at the next step end (`workers/jobside/runwarden_preempt.py`).
The continuation keeps every per-run setting of the launch, as `resume` does: its own
`--preemption gcp` (so it watches GCP on the SSH target too), timeouts and limits."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.fakecloud import FakeCloud
from bench.harness.notice_env import running
from bench.harness.pipeline import Pipeline, running_pipeline, toy
from bench.harness.processes import kill_job_groups
from bench.harness.sshd import SshServer, running_sshd
from schemas import (
    ArtifactsPhase,
    Preemption,
    RunLimits,
    RunRecord,
    RunState,
    SnapshotReason,
    SshOptions,
    TargetConfig,
)
from schemas.auth import WORKER
from schemas.budget import StopTimeouts
from schemas.chain import ContinuationPhase, OnPreempt, continuation_key
from schemas.events import LaunchSpec
from schemas.idempotency import owned_launch_key
from schemas.protocol import SNAPSHOT_REQUEST

from ...conftest import wait_for
from .test_cli import as_json, ok, rw

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 60.0


@pytest.fixture
def gcp() -> Iterator[FakeCloud]:
    with running("gcp") as fake:
        yield fake


@pytest.fixture
def service(tmp_path: Path, gcp: FakeCloud) -> Iterator[tuple[Pipeline, SshServer]]:
    clocks = {
        "RUNWARDEN_PROOF_TIMEOUT_S": "90",
        "RUNWARDEN_END_TIMEOUT_S": "60",
        "RUNWARDEN_METADATA_GCP_URL": gcp.url,
        "RUNWARDEN_NOTICE_POLL_S": "0.5",
    }
    with (
        running_sshd(tmp_path / "sshd") as server,
        running_pipeline(tmp_path / "service", extra_env=clocks) as pipeline,
    ):
        pipeline.api.add_target(
            TargetConfig(
                name="remote",
                kind="ssh",
                workdir=str(server.workdir),
                ssh=SshOptions(
                    destination=f"{server.user}@{server.host}",
                    port=server.port,
                    identity=str(server.client_key),
                    known_hosts=str(server.known_hosts),
                ),
            )
        )
        try:
            yield pipeline, server
        finally:
            kill_job_groups(r for r in pipeline.api.list_runs() if not r.state.is_terminal)


def preempt(
    pipeline: Pipeline, run_id: str, after_step: int, cloud: FakeCloud | None = None
) -> RunRecord:
    """Once the run passed `after_step`: `cloud`'s notice, else a SIGTERM to the run's
    process group; returns the run as it ended, its checkpoint retrieved."""
    pipeline.wait_step(run_id, after_step, timeout_s=START_TIMEOUT_S)
    run = pipeline.api.get_run(run_id)
    assert run.job is not None
    if cloud is not None:
        cloud.notice_on()
        # Withdrawn once its watcher asked: the continuation watches the same cloud.
        asked = Path(run.remote_dir) / SNAPSHOT_REQUEST
        wait_for(asked.exists, timeout_s=30, interval_s=0.05)
        cloud.notice_off()
    else:
        os.killpg(run.job.pid, signal.SIGTERM)  # the job and its wrapper, as a pod gets it
    ended = pipeline.wait_state(run_id, timeout_s=120)
    assert ended.state is RunState.STOPPED, (ended, pipeline.logs())
    assert ended.snapshot is not None
    assert ended.snapshot.reason is SnapshotReason.PREEMPTED

    def retrieved() -> RunRecord | None:
        now = pipeline.api.get_run(run_id)
        done = now.artifacts is not None and now.artifacts.phase is ArtifactsPhase.DONE
        return now if done else None

    return wait_for(retrieved, timeout_s=120)


def decided(pipeline: Pipeline, run_id: str) -> RunRecord:
    """The run once its continuation left `waiting` (launched or declined)."""

    def left_waiting() -> RunRecord | None:
        run = pipeline.api.get_run(run_id)
        waiting = run.continuation
        return run if waiting is not None and waiting.phase != ContinuationPhase.WAITING else None

    found = wait_for(left_waiting, timeout_s=60)
    assert isinstance(found, RunRecord)
    return found


def test_a_preempted_run_goes_on_on_the_next_target_up_to_its_limit(
    service: tuple[Pipeline, SshServer], gcp: FakeCloud
) -> None:
    pipeline, server = service
    command = toy("--steps", "100000", "--step-time", "0.1")
    plan = OnPreempt(targets=("local", "remote"), max_preemptions=1)
    own = {
        "limits": RunLimits(max_hours=2),
        "timeouts": StopTimeouts(proof_timeout_s=100, end_timeout_s=60),
        "preemption": "gcp",
    }
    spec = LaunchSpec(target="local", command=command, name="toy", on_preempt=plan, **own)
    first = pipeline.api.launch(spec, wait_s=60)

    # 1: a GCP notice on `local`; continued on `remote`, from the verified checkpoint.
    ended = preempt(pipeline, first.id, 3, cloud=gcp)
    assert ended.snapshot is not None
    assert ended.preemption is not None
    assert ended.preemption.notice is not None
    assert ended.preemption.notice.source == "gcp-preempted"
    (stop,) = pipeline.api.store.stops.history(first.id)
    assert stop.asked_by == "notice:gcp-preempted"
    step = ended.snapshot.step

    source = decided(pipeline, first.id)
    assert source.continuation is not None
    assert source.continuation.phase is ContinuationPhase.LAUNCHED, (source, pipeline.logs())
    assert source.continuation.target == "remote"
    assert source.continuation.preemptions == 1
    second_id = wait_for(
        lambda: pipeline.api.store.launches.launch(
            owned_launch_key(WORKER, continuation_key(first.id))
        ),
        timeout_s=60,
    )
    second = pipeline.api.get_run(second_id)
    assert second.target == "remote"
    assert second.resumed_from == first.id
    assert second.remote_dir.startswith(str(server.workdir))
    assert second.on_preempt == plan
    assert second.chain_preemptions == 1
    # The run's own settings, as a resume keeps them: it watches GCP there too.
    assert (second.limits, second.timeouts) == (own["limits"], own["timeouts"])
    assert (second.preemption_mode, second.preemption) == ("gcp", Preemption(cloud="gcp"))
    # It goes on from the checkpoint: the step continues.
    pipeline.wait_step(second.id, step + 2, timeout_s=START_TIMEOUT_S)
    log = (Path(second.remote_dir) / "job.log").read_text()
    assert f"resuming from {second.remote_dir}/output/checkpoint-{step}" in log, log[-2000:]
    metrics = [
        json.loads(line)
        for line in (Path(second.remote_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    logged = [m["step"] for m in metrics if m.get("event") == "log"]
    assert logged, metrics
    assert logged[0] > step, logged

    # 2: preempted again, on `remote`: the chain's second preemption is past its
    # limit of 1, so it stays stopped, and says why.
    again = preempt(pipeline, second.id, step + 3)
    assert again.snapshot is not None
    assert again.snapshot.step > step

    last = decided(pipeline, second.id)
    assert last.continuation is not None
    assert last.continuation.phase is ContinuationPhase.DECLINED, last
    assert last.continuation.preemptions == 2
    assert "at most 1" in (last.continuation.reason or "")
    time.sleep(3)  # a reconcile or two: nothing more is launched
    assert (
        pipeline.api.store.launches.launch(owned_launch_key(WORKER, continuation_key(second.id)))
        is None
    )
    assert [r.id for r in pipeline.api.chain(first.id)] == [first.id, second.id]
    assert [r.id for r in pipeline.api.chain(second.id)] == [first.id, second.id]

    # What a person sees: the chain in `show`, and grouped by `runs --chains`.
    shown = ok(rw(pipeline, "show", second.id))
    assert f"{first.id} (local, stopped, preempted) -> *{second.id} (remote, stopped, " in shown
    assert "declined, preemption 2 of its chain" in shown, shown
    groups = as_json(rw(pipeline, "runs", "--chains", "--json"))
    assert isinstance(groups, list)
    assert [[r["id"] for r in g] for g in groups] == [[first.id, second.id]]
