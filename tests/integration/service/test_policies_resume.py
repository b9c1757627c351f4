"""Issue 6 end to end, with real redis-server, Celery worker and beat, real detached
jobs and shortened clocks: the policies ask snapshots (deadline, cost, disk on a real
small tmpfs), the on-target watchdog asks alone when every worker and Redis are
gone, ended runs bring their artifacts home verified (retried with backoff when
that fails), and a stopped run resumes where it stopped, twice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from bench.harness.users import as_the_worker
from schemas import ArtifactsPhase, RunLimits, RunRecord, RunState, SnapshotReason, TargetConfig
from schemas.events import LaunchSpec

from ...conftest import process_alive

pytestmark = pytest.mark.slow

LEAD_S = 3.0
POLICY_ENV = {"RUNWARDEN_DEADLINE_LEAD_S": str(LEAD_S)}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """One service for the module: each test works on runs of its own and leaves the
    service serving."""
    with running_pipeline(tmp_path_factory.mktemp("policies"), extra_env=POLICY_ENV) as started:
        yield started


@pytest.fixture
def own_pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    """A service for one test, which stops all of it."""
    with running_pipeline(tmp_path, extra_env=POLICY_ENV) as started:
        yield started


def launch(
    pipeline: Pipeline, *args: str, limits: RunLimits | None = None, target: str = "local",
    steps: int = 100000, upload: Path | None = None,
) -> RunRecord:  # fmt: skip
    spec = LaunchSpec(
        target=target,
        command=toy("--steps", str(steps), "--step-time", "0.05", *args),
        limits=limits or RunLimits(),
        upload=upload,
    )
    return pipeline.api.launch(spec, wait_s=60)


def wait_artifacts(pipeline: Pipeline, run_id: str, timeout_s: float = 60.0) -> RunRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = pipeline.api.get_run(run_id)
        if run.artifacts is not None and run.artifacts.phase is not ArtifactsPhase.PENDING:
            return run
        time.sleep(0.2)
    run = pipeline.api.get_run(run_id)
    raise AssertionError(f"no retrieval of {run_id}: {run}\n{pipeline.logs()}")


def first_stop(pipeline: Pipeline, run_id: str) -> tuple[str, str]:
    history = pipeline.api.store.stops.history(run_id)
    assert history, pipeline.logs()
    oldest = history[-1]
    return str(oldest.reason), oldest.asked_by


def test_a_tiny_max_hours_gets_a_deadline_snapshot(pipeline: Pipeline) -> None:
    hours = 9 / 3600  # asked LEAD_S before: about 6 s after the start
    run = launch(pipeline, limits=RunLimits(max_hours=hours, disk=False))
    ended = pipeline.wait_state(run.id, timeout_s=40)
    assert ended.state is RunState.STOPPED, ended
    assert ended.snapshot is not None
    assert ended.snapshot.reason is SnapshotReason.DEADLINE
    assert ended.started is not None
    assert ended.ended is not None
    assert (ended.ended - ended.started).total_seconds() >= 9 - LEAD_S - 1.0
    reason, asked_by = first_stop(pipeline, run.id)
    assert reason == "deadline"
    # The policy and the watchdog both watch the clock; either may be first.
    assert asked_by in {"policy:deadline", "watch"}


def test_a_tiny_cost_cap_gets_a_cost_snapshot(pipeline: Pipeline) -> None:
    # 1 USD at 600 USD/h: 95 % of the cap after 5.7 s.
    run = launch(pipeline, limits=RunLimits(max_cost_usd=1, usd_per_hour=600, disk=False))
    ended = pipeline.wait_state(run.id, timeout_s=40)
    assert ended.state is RunState.STOPPED, ended
    assert ended.snapshot is not None
    assert ended.snapshot.reason is SnapshotReason.COST
    assert ended.started is not None
    assert ended.ended is not None
    assert (ended.ended - ended.started).total_seconds() >= 4.7
    assert first_stop(pipeline, run.id) == ("cost", "policy:cost")
    # No max_hours, no watchdog.
    assert not (Path(run.remote_dir) / ".runwarden" / "watchdog.pid").exists()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 16 MiB tmpfs, made by the test (the machine runs the tests as root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"cannot mount a tmpfs (needs root): {done.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


DISK_ENV = {"RUNWARDEN_DISK_USED_FRACTION": "0.92", "RUNWARDEN_DISK_CHECKPOINT_FACTOR": "1.5"}


def test_a_filling_disk_gets_a_disk_snapshot(tmp_path: Path, small_disk: Path) -> None:
    with running_pipeline(tmp_path, extra_env={**POLICY_ENV, **DISK_ENV}) as pipeline:
        _fill_and_stop(pipeline, small_disk)


def _fill_and_stop(pipeline: Pipeline, small_disk: Path) -> None:
    workdir = str(small_disk / "w")
    small = TargetConfig(name="small", kind="local", workdir=workdir, **as_the_worker())
    pipeline.api.add_target(small)
    run = launch(pipeline, target="small")
    pipeline.wait_step(run.id, 3)
    time.sleep(3)  # a probe or two while there is room: nothing is asked
    assert pipeline.api.get_stop(run.id) is None
    assert pipeline.api.get_run(run.id).state is RunState.RUNNING
    with (small_disk / "filler").open("wb") as filler:  # to about 94 % used
        filler.write(b"\0" * (15 * 1024 * 1024 + 64 * 1024))
    ended = pipeline.wait_state(run.id, timeout_s=40)
    assert ended.state is RunState.STOPPED, ended
    assert ended.snapshot is not None
    assert ended.snapshot.reason is SnapshotReason.DISK
    assert first_stop(pipeline, run.id) == ("disk", "policy:disk")
    stop = pipeline.api.store.stops.history(run.id)[-1]
    assert stop.asked_by == "policy:disk"


def test_the_watchdog_asks_alone_when_redis_and_every_worker_are_gone(
    own_pipeline: Pipeline,
) -> None:
    pipeline = own_pipeline
    # Asked 17 s after the start: long enough to stop everything first.
    run = launch(pipeline, limits=RunLimits(max_hours=20 / 3600, disk=False))
    run_dir = Path(run.remote_dir)
    pipeline.stop()  # every worker and beat
    pipeline.redis.stop()
    watchdog = int((run_dir / ".runwarden" / "watchdog.pid").read_text())
    assert process_alive(watchdog)
    assert not (run_dir / "snapshot.request").exists()
    deadline = time.monotonic() + 45
    while not (run_dir / "exit_code").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (run_dir / "snapshot.request").read_text().strip() == "deadline"
    assert (run_dir / "exit_code").read_text().strip() == "0"
    proof = json.loads((run_dir / "snapshot.json").read_text())
    assert proof["reason"] == "deadline"
    deadline = time.monotonic() + 5  # exits with the job (poll 0.5 s here)
    while process_alive(watchdog) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(watchdog)
    # The service comes back and records what happened while it was away.
    pipeline.redis.start()
    pipeline.start_worker()
    pipeline.start_beat()
    pipeline.wait_ready()
    ended = pipeline.wait_state(run.id, timeout_s=40)
    assert ended.state is RunState.STOPPED, ended
    assert ended.snapshot is not None
    assert ended.snapshot.reason is SnapshotReason.DEADLINE
    assert wait_artifacts(pipeline, run.id).artifacts.phase is ArtifactsPhase.DONE  # type: ignore[union-attr]


def test_a_stopped_run_brings_its_checkpoint_home_verified(pipeline: Pipeline) -> None:
    run = launch(pipeline, "--save-every", "2")
    pipeline.wait_step(run.id, 5)
    pipeline.api.stop(run.id)
    ended = pipeline.wait_state(run.id)
    assert ended.state is RunState.STOPPED
    assert ended.snapshot is not None
    done = wait_artifacts(pipeline, run.id)
    artifacts = done.artifacts
    assert artifacts is not None, artifacts
    assert artifacts.phase is ArtifactsPhase.DONE, artifacts
    home = pipeline.api.settings.artifacts_root / run.id
    assert artifacts.path == str(home)
    checkpoint = ended.snapshot.checkpoint
    assert (home / checkpoint / "state.json").is_file()
    proof = (Path(run.remote_dir) / "snapshot.json").read_bytes()
    assert (home / "snapshot.json").read_bytes() == proof
    assert (home / "job.log").is_file()
    # Only the proof's checkpoint: the intermediate ones stay on the target.
    assert sorted(p.name for p in (home / "output").iterdir()) == [checkpoint.split("/")[1]]
    assert len(list((Path(run.remote_dir) / "output").iterdir())) > 1
    manifest = json.loads((home / "manifest.json").read_text())
    assert artifacts.files == len(manifest["files"] if isinstance(manifest, dict) else manifest)


def test_a_succeeded_run_brings_home_its_output_without_checkpoints(pipeline: Pipeline) -> None:
    run = launch(pipeline, "--save-every", "3", steps=8)
    ended = pipeline.wait_state(run.id)
    assert ended.state is RunState.SUCCEEDED, ended
    done = wait_artifacts(pipeline, run.id)
    assert done.artifacts is not None
    assert done.artifacts.phase is ArtifactsPhase.DONE
    home = pipeline.api.settings.artifacts_root / run.id
    assert "training done at step 8" in (home / "job.log").read_text()
    assert len(list(Path(run.remote_dir).glob("output/checkpoint-*"))) == 3
    assert not list(home.glob("**/checkpoint-*"))


def test_a_failed_retrieval_is_retried_with_backoff_and_shown(tmp_path: Path) -> None:
    blocked = tmp_path / "artifacts"
    blocked.write_text("not a directory")
    env = {**POLICY_ENV, "RUNWARDEN_ARTIFACT_DIR": str(blocked)}
    with running_pipeline(tmp_path, extra_env=env) as pipeline:
        run = launch(pipeline, steps=5)
        assert pipeline.wait_state(run.id).state is RunState.SUCCEEDED
        deadline = time.monotonic() + 30
        seen = pipeline.api.get_run(run.id).artifacts
        while time.monotonic() < deadline:
            seen = pipeline.api.get_run(run.id).artifacts
            if seen is not None and seen.attempts >= 2:
                break
            time.sleep(0.2)
        assert seen is not None, pipeline.logs()
        assert seen.attempts >= 2, pipeline.logs()
        assert seen.phase is ArtifactsPhase.PENDING
        assert seen.error
        assert seen.next_attempt
        shown = subprocess.run(
            [sys.executable, "-m", "producers.cli", "show", run.id],
            env=pipeline.env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "artifacts" in shown.stdout, shown.stdout
        assert "pending after" in shown.stdout, shown.stdout
        blocked.unlink()  # fixed: the next attempt (backoff at most 4 s here) succeeds
        done = wait_artifacts(pipeline, run.id, timeout_s=30)
        assert done.artifacts is not None
        assert done.artifacts.phase is ArtifactsPhase.DONE
        assert (blocked / run.id / "job.log").is_file()


def test_stop_resume_stop_resume_continues_the_steps(pipeline: Pipeline) -> None:
    # An upload directory that carries a stale request and proof: never inherited.
    # Under the service's directory: the target's upload root.
    upload = pipeline.tmp / "stop-resume-upload"
    upload.mkdir()
    (upload / "snapshot.request").write_text("requested")
    (upload / "snapshot.json").write_text('{"checkpoint": "output/checkpoint-1", "step": 1}')
    first = launch(pipeline, upload=upload)
    pipeline.wait_step(first.id, 4)
    pipeline.api.stop(first.id)
    stopped = pipeline.wait_state(first.id)
    assert stopped.state is RunState.STOPPED
    assert stopped.snapshot is not None
    assert stopped.snapshot.step >= 4
    wait_artifacts(pipeline, first.id)
    steps = [stopped.snapshot.step]
    previous = first.id
    for _ in range(2):
        spec = pipeline.api.resume_spec(previous)
        run = pipeline.api.launch(spec, wait_s=60)
        assert run.resumed_from == previous
        assert run.upload == str(upload)
        pipeline.wait_step(run.id, steps[-1] + 4)
        assert pipeline.api.get_run(run.id).state is RunState.RUNNING  # no stale request
        metrics = pipeline.api.store.follow.read_metrics(run.id)
        begin = next(e.record for e in metrics if e.record.get("event") == "begin")
        assert begin["first_step"] == steps[-1] + 1
        pipeline.api.stop(run.id)
        ended = pipeline.wait_state(run.id)
        assert ended.state is RunState.STOPPED, ended
        assert ended.snapshot is not None, ended
        assert ended.snapshot.step > steps[-1] + 3
        steps.append(ended.snapshot.step)
        wait_artifacts(pipeline, run.id)
        previous = run.id
    assert steps == sorted(steps)


def test_resume_is_refused_for_a_run_that_is_not_stopped(pipeline: Pipeline) -> None:
    from schemas import NotResumable

    run = launch(pipeline, steps=3)
    assert pipeline.wait_state(run.id).state is RunState.SUCCEEDED
    with pytest.raises(NotResumable, match="succeeded, not stopped"):
        pipeline.api.resume_spec(run.id)
    spec = LaunchSpec(target="local", command="true", resume_from=run.id)
    with pytest.raises(NotResumable):
        pipeline.api.launch(spec)
    shown = subprocess.run(
        [sys.executable, "-m", "producers.cli", "resume", run.id],
        env=pipeline.env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert shown.returncode == 1
    assert "cannot be resumed" in shown.stderr
