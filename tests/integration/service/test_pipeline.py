"""The event pipeline end to end: real redis-server, Celery worker and beat
processes, the toy trainer as the job, shortened clocks (bench/harness/pipeline.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from schemas import RunState, SnapshotReason
from schemas.auth import new_task_id, sign
from schemas.events import LaunchSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """One service for the module: each test works on runs of its own and leaves the
    service serving."""
    with running_pipeline(tmp_path_factory.mktemp("pipeline")) as started:
        yield started


@pytest.fixture
def own_pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    """A service for one test, which restarts its Redis."""
    with running_pipeline(tmp_path) as started:
        yield started


def launch(pipeline: Pipeline, *args: str) -> str:
    spec = LaunchSpec(
        target="local", command=toy("--steps", "100000", "--step-time", "0.05", *args)
    )
    return pipeline.api.launch(spec, wait_s=60).id


def test_stop_ends_with_a_snapshot(pipeline: Pipeline) -> None:
    run_id = launch(pipeline)
    assert pipeline.api.get_run(run_id).state is RunState.RUNNING
    pipeline.wait_step(run_id, 5)
    stop = pipeline.api.stop(run_id, asked_by="test")
    assert stop.reason is SnapshotReason.REQUESTED
    run = pipeline.wait_state(run_id)
    assert run.state is RunState.STOPPED, run
    assert run.snapshot is not None
    assert run.snapshot.checkpoint == f"output/checkpoint-{run.snapshot.step}"
    assert (Path(run.remote_dir) / run.snapshot.checkpoint).is_dir()
    assert pipeline.api.get_stop(run_id) is None
    history = pipeline.api.store.stops.history(run_id)
    assert history
    assert all("cancel" not in (h.note or "") for h in history)
    assert pipeline.api.store.follow.read_log(run_id)  # the log was followed


def test_a_job_that_ignores_requests_is_cancelled_at_the_proof_timeout(pipeline: Pipeline) -> None:
    run_id = launch(pipeline, "--ignore-requests")
    pipeline.wait_step(run_id, 2)
    pipeline.api.stop(run_id)
    run = pipeline.wait_state(run_id, timeout_s=40)
    assert run.state is RunState.CANCELLED, run
    assert run.snapshot is None


def test_a_job_that_proves_then_hangs_is_cancelled_at_the_end_timeout(pipeline: Pipeline) -> None:
    run_id = launch(pipeline, "--hang-after-proof")
    pipeline.wait_step(run_id, 2)
    pipeline.api.stop(run_id, reason=SnapshotReason.COST)
    run = pipeline.wait_state(run_id, timeout_s=40)
    assert run.state is RunState.STOPPED, run  # the proof wins over the cancel
    assert run.snapshot is not None
    assert run.snapshot.reason is SnapshotReason.COST


def test_a_request_written_by_someone_else_is_picked_up(pipeline: Pipeline) -> None:
    run_id = launch(pipeline, "--ignore-requests")
    run = pipeline.api.get_run(run_id)
    (Path(run.remote_dir) / "snapshot.request").write_text("deadline")
    # Picked up by the next follow tick (0.5 s here), then the same timers apply.
    import time

    deadline = time.monotonic() + 6
    while pipeline.api.get_stop(run_id) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    stop = pipeline.api.get_stop(run_id)
    assert stop is not None, pipeline.logs()
    assert stop.reason is SnapshotReason.DEADLINE
    run = pipeline.wait_state(run_id, timeout_s=40)
    assert run.state is RunState.CANCELLED  # it ignores requests: proof timeout


def test_malformed_bodies_are_refused_and_the_worker_carries_on(pipeline: Pipeline) -> None:
    from celery.exceptions import CeleryError

    for name, body in [
        ("runwarden.snapshot_request", {"run_id": "../../etc", "reason": "cost"}),
        ("runwarden.snapshot_request", {"nope": 1}),
        ("runwarden.launch", {"target": "local"}),
        ("runwarden.cancel", "not an object"),
        ("runwarden.proof_timeout", {"run_id": "r", "stop_id": "x|y"}),
    ]:
        result = pipeline.send(name, body)
        with pytest.raises(Exception) as raised:  # noqa: PT011 - the worker's own error
            result.get(timeout=20)
        assert not isinstance(raised.value, CeleryError), raised.value
        assert "invalid body" in str(raised.value)
    # The internal fan-out tasks carry no signature: a made-up target changes nothing
    # (before: a tick, a lock and a metrics series per name, 300 characters long too).
    before = {series.labels for series in pipeline.api.store.counters.series()}
    for name in ("runwarden.watch_target", "runwarden.policy_target"):
        for target in ("made-up", "x" * 300, "../etc", 7):
            sent = pipeline.api.app.send_task(name, kwargs={"target": target}, ignore_result=False)
            assert sent.get(timeout=20) == {"refused": 1}
    after = {series.labels for series in pipeline.api.store.counters.series()}
    assert not [labels for labels in after - before if "made-up" in labels or "x" * 300 in labels]
    # Still serving.
    run_id = launch(pipeline)
    assert pipeline.api.get_run(run_id).state is RunState.RUNNING
    pipeline.api.cancel(run_id)
    assert pipeline.api.get_run(run_id).state is RunState.CANCELLED


def test_unsigned_and_forged_messages_are_refused(pipeline: Pipeline) -> None:
    from celery.exceptions import CeleryError

    # A job that never proves: the cancel at the end finds no snapshot to keep.
    run_id = launch(pipeline, "--ignore-requests")
    body = {"run_id": run_id, "reason": "cost", "asked_by": "billing"}
    key, _ = pipeline.api.settings.secrets.ensure("producer.operator.key")
    pipeline.api.settings.secrets.ensure("producer.billing.key")  # added by the operator
    task = "runwarden.snapshot_request"

    def auth(
        tid: str, *, at: float | None = None, of: str = task, producer: str = "operator"
    ) -> dict[str, Any]:
        moment = time.time() if at is None else at
        return sign(of, body, producer, key, at=moment, task_id=tid)

    cases: list[tuple[Callable[[str], dict[str, Any] | None], str]] = [
        (lambda tid: None, "not signed"),
        (lambda tid: {**auth(tid), "sig": "0" * 64}, "does not match"),
        (lambda tid: auth(tid, at=time.time() - 10**7), "too old"),
        (lambda tid: auth(tid, of="runwarden.cancel"), "does not match"),
        (lambda tid: auth(tid, producer="nobody"), "has no key"),
        # A signed message sent again under a new id: a replay.
        (lambda tid: auth(new_task_id()), "made for another message"),
        (lambda tid: {k: v for k, v in auth(tid).items() if k != "id"}, "the message's task id"),
    ]
    for make, why in cases:
        task_id = new_task_id()
        signed_auth = make(task_id)
        kwargs = {"body": body} if signed_auth is None else {"body": body, "auth": signed_auth}
        result = pipeline.api.app.send_task(task, kwargs=kwargs, task_id=task_id)
        with pytest.raises(Exception) as raised:  # noqa: PT011 - the worker's own error
            result.get(timeout=20)
        assert not isinstance(raised.value, CeleryError), raised.value
        assert why in str(raised.value), raised.value
    assert pipeline.api.get_stop(run_id) is None  # nothing asked
    # A producer's stop is recorded as asked by it, whatever its body claims.
    pipeline.send("runwarden.snapshot_request", body, producer="billing").get(timeout=20)
    stop = pipeline.api.get_stop(run_id)
    assert stop is not None
    assert stop.asked_by == "billing"
    pipeline.send("runwarden.cancel", {"run_id": run_id}, producer="billing").get(timeout=60)
    assert pipeline.api.get_run(run_id).state is RunState.CANCELLED


def test_a_redis_restart_in_the_middle_of_a_stop(own_pipeline: Pipeline) -> None:
    # The job ignores requests: the stop can only end through the proof deadline,
    # which must survive the restart (AOF) and still be acted on.
    pipeline = own_pipeline
    run_id = launch(pipeline, "--ignore-requests")
    pipeline.wait_step(run_id, 2)
    stop = pipeline.api.stop(run_id, asked_by="test")
    pipeline.redis.restart()
    assert pipeline.api.get_stop(run_id) == stop  # the stop is still there
    run = pipeline.wait_state(run_id, timeout_s=60)
    assert run.state is RunState.CANCELLED, run
    assert pipeline.api.get_stop(run_id) is None
