"""The time policies, the resume check, the retrieval queue and the worker's policy and
retrieval decisions, on fakeredis with a real local executor (fast; the pipeline
tests run the same code with real Redis, Celery and jobs)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from schemas import (
    Artifacts,
    ArtifactsPhase,
    Conflict,
    JobId,
    JobStatus,
    NotResumable,
    RunLimits,
    RunRecord,
    RunState,
    Settings,
    Snapshot,
    SnapshotReason,
)
from schemas.events import TASK_RETRIEVE, TASK_SNAPSHOT_REQUEST, RetrieveBody, SnapshotRequestBody
from schemas.policy import cost_request_after_s, deadline_request_after_s, time_verdict
from schemas.run import check_resumable
from store import RunStore
from workers import finish, policies, stops
from workers.artifacts import retrieve_artifacts as retrieve
from workers.context import Context
from workers.errors import RetrievalError

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def record(**changes: Any) -> RunRecord:
    base: dict[str, Any] = {
        "id": "r1",
        "target": "local",
        "created": T0 - timedelta(minutes=5),
        "started": T0,
        "remote_dir": "/tmp/x/r1",
        "job": JobId(dir="/tmp/x/r1", pid=4242),
        "state": RunState.RUNNING,
        "command": "true",
    }
    base.update(changes)
    return RunRecord(**base)


# --- time policies ----------------------------------------------------------------------


def test_the_deadline_is_asked_the_lead_before_max_hours() -> None:
    run = record(limits=RunLimits(max_hours=2))
    lead = 15 * 60
    assert deadline_request_after_s(run.limits, lead) == 2 * 3600 - lead
    just_before = T0 + timedelta(hours=2, minutes=-15, seconds=-1)
    assert time_verdict(run, just_before, lead_s=lead, cost_fraction=0.95) is None
    verdict = time_verdict(run, just_before + timedelta(seconds=1), lead_s=lead, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.DEADLINE


def test_a_budget_shorter_than_the_lead_is_asked_at_once() -> None:
    run = record(limits=RunLimits(max_hours=0.1))
    assert deadline_request_after_s(run.limits, 900) == 0
    verdict = time_verdict(run, T0, lead_s=900, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.DEADLINE


def test_the_cost_is_asked_at_95_percent_of_the_cap() -> None:
    run = record(limits=RunLimits(max_cost_usd=100, usd_per_hour=10))
    after = cost_request_after_s(run.limits, 0.95)
    assert after == pytest.approx(9.5 * 3600)
    assert time_verdict(run, T0 + timedelta(hours=9.49), lead_s=900, cost_fraction=0.95) is None
    verdict = time_verdict(run, T0 + timedelta(hours=9.5), lead_s=900, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.COST
    assert "95%" in verdict.why
    assert "100 USD" in verdict.why


def test_when_both_passed_the_earlier_one_is_the_reason() -> None:
    # cost at 95 % comes after 0.95 h; the deadline (1 h - 15 min) after 0.75 h.
    run = record(limits=RunLimits(max_hours=1, max_cost_usd=1, usd_per_hour=1))
    verdict = time_verdict(run, T0 + timedelta(hours=2), lead_s=900, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.DEADLINE
    run = record(limits=RunLimits(max_hours=10, max_cost_usd=1, usd_per_hour=1))
    verdict = time_verdict(run, T0 + timedelta(hours=20), lead_s=900, cost_fraction=0.95)
    assert verdict is not None
    assert verdict.reason is SnapshotReason.COST


def test_the_clock_starts_when_the_run_started_not_when_it_was_created() -> None:
    run = record(limits=RunLimits(max_hours=1), created=T0 - timedelta(hours=5))
    assert time_verdict(run, T0 + timedelta(minutes=40), lead_s=900, cost_fraction=0.95) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"state": RunState.STOPPED},
        {"state": RunState.PREPARING},
        {"snapshots": False},
        {"limits": RunLimits()},
    ],
)
def test_runs_that_cannot_be_asked_get_no_verdict(changes: dict[str, Any]) -> None:
    base: dict[str, Any] = {"limits": RunLimits(max_hours=0.01)}
    base.update(changes)
    run = record(**base)
    assert time_verdict(run, T0 + timedelta(days=1), lead_s=0, cost_fraction=0.95) is None


def test_limits_refuse_nonsense() -> None:
    for bad in ({"max_hours": 0}, {"max_hours": float("inf")}, {"max_hours": 300_000},
                {"max_cost_usd": 5},
                {"usd_per_hour": float("nan")}):  # fmt: skip
        with pytest.raises(ValueError, match="validation error"):
            RunLimits(**bad)


# --- resume check -------------------------------------------------------------------------


def stopped(**changes: Any) -> RunRecord:
    snap = Snapshot(checkpoint="output/checkpoint-7", step=7, reason=SnapshotReason.COST)
    base: dict[str, Any] = {
        "state": RunState.STOPPED,
        "snapshot": snap,
        "artifacts": Artifacts(phase=ArtifactsPhase.DONE, files=3, bytes=10),
    }
    base.update(changes)
    return record(**base)


def test_a_stopped_run_with_its_artifacts_is_resumable() -> None:
    assert check_resumable(stopped()).step == 7


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"state": RunState.SUCCEEDED, "snapshot": None}, "succeeded, not stopped"),
        ({"state": RunState.RUNNING, "snapshot": None}, "running, not stopped"),
        ({"artifacts": None}, "no retrieval was recorded"),
        (
            {"artifacts": Artifacts(attempts=2, error="ssh: connection refused")},
            "retrieval is pending (last error: ssh: connection refused)",
        ),
        ({"artifacts": Artifacts(phase=ArtifactsPhase.FAILED)}, "retrieval is failed"),
    ],
)
def test_resume_is_refused_with_the_reason(changes: dict[str, Any], why: str) -> None:
    with pytest.raises(NotResumable) as caught:
        check_resumable(stopped(**changes))
    assert why in str(caught.value)
    assert str(caught.value).startswith("run 'r1' cannot be resumed")
    rebuilt = NotResumable(*caught.value.args)  # Celery's JSON backend does this
    assert str(rebuilt) == str(caught.value)


# --- the store's retrieval queue -----------------------------------------------------------


def fresh_store() -> RunStore:
    return RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))


def test_the_retrieval_queue_returns_due_runs_until_dropped() -> None:
    store = fresh_store()
    store.schedule_retrieval("a", T0)
    store.schedule_retrieval("b", T0 + timedelta(seconds=30))
    assert store.due_retrievals(T0) == ["a"]
    assert store.due_retrievals(T0 + timedelta(minutes=1)) == ["a", "b"]
    store.schedule_retrieval("a", T0 + timedelta(hours=1))  # moved on, not added twice
    assert store.due_retrievals(T0 + timedelta(minutes=1)) == ["b"]
    assert [r for r, _ in store.pending_retrievals()] == ["b", "a"]
    assert store.drop_retrieval("b")
    assert not store.drop_retrieval("b")
    with pytest.raises(ValueError, match="run id"):
        store.schedule_retrieval("../evil", T0)


def test_started_and_ended_are_stamped_by_the_transitions() -> None:
    store = fresh_store()
    assert store.create_run(record(state=RunState.PREPARING, started=None, job=None))
    running = store.transition("r1", RunState.RUNNING, job=JobId(dir="/tmp/x/r1", pid=4242))
    assert running.started is not None
    assert running.ended is None
    ended = store.transition("r1", RunState.FAILED, message="x")
    assert ended.ended is not None
    assert ended.started == running.started


# --- the worker's policy tick -----------------------------------------------------------------


class Sent:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], float]] = []

    def __call__(self, name: str, kwargs: dict[str, Any], countdown_s: float) -> None:
        self.calls.append((name, kwargs, countdown_s))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [k["body"] for n, k, _ in self.calls if n == name]


def policy_worker(tmp_path: Path, **settings: Any) -> tuple[Context, RunStore, Sent]:
    store = fresh_store()
    store.put_target("local", {"name": "local", "kind": "local", "workdir": str(tmp_path)})
    sent = Sent()
    options: dict[str, Any] = {"state_dir": tmp_path / "state", "disk_probe_s": 60}
    options.update(settings)
    return Context(store, Settings(**options), sent, "w"), store, sent


def running_run(store: RunStore, tmp_path: Path, run_id: str, **changes: Any) -> RunRecord:
    run_dir = tmp_path / run_id
    run_dir.mkdir()
    base: dict[str, Any] = {
        "id": run_id,
        "remote_dir": str(run_dir),
        "job": JobId(dir=str(run_dir), pid=os.getpid()),
        "started": datetime.now(UTC) - timedelta(hours=1),
    }
    base.update(changes)
    run = record(**base)
    assert store.create_run(run)
    store.follow(run_id)
    return run


def test_the_policy_tick_publishes_one_request_per_run_as_a_producer(tmp_path: Path) -> None:
    worker, store, sent = policy_worker(tmp_path)
    running_run(store, tmp_path, "late", limits=RunLimits(max_hours=1.1, disk=False))
    running_run(store, tmp_path, "costly",
                limits=RunLimits(max_cost_usd=10, usd_per_hour=10, disk=False))  # fmt: skip
    running_run(store, tmp_path, "fine", limits=RunLimits(max_hours=100, disk=False))
    result = policies.policy_target(worker, "local", datetime.now(UTC))
    assert result == {"runs": 3, "asked": 2}
    published = sent.named(TASK_SNAPSHOT_REQUEST)
    bodies = {b["run_id"]: SnapshotRequestBody.model_validate(b) for b in published}
    assert set(bodies) == {"late", "costly"}
    assert bodies["late"].reason is SnapshotReason.DEADLINE
    assert bodies["costly"].reason is SnapshotReason.COST
    assert all(b.only_if_none_open for b in bodies.values())
    assert bodies["costly"].asked_by == "policy:cost"
    # The next tick within the policy period publishes nothing more.
    policies.policy_target(worker, "local", datetime.now(UTC))
    assert len(sent.named(TASK_SNAPSHOT_REQUEST)) == 2


def test_a_run_with_an_open_stop_is_never_asked_by_a_policy(tmp_path: Path) -> None:
    worker, store, sent = policy_worker(tmp_path)
    running_run(store, tmp_path, "asked", limits=RunLimits(max_hours=0.5, disk=False))
    store.open_stop("asked", SnapshotReason.REQUESTED, "cli", datetime.now(UTC), 60)
    policies.policy_target(worker, "local", datetime.now(UTC))
    assert sent.named(TASK_SNAPSHOT_REQUEST) == []


def test_a_policy_request_keeps_the_first_reason_of_an_open_stop(tmp_path: Path) -> None:
    worker, store, sent = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r2", limits=RunLimits(max_hours=0.5))
    stops.request_snapshot(worker, "r2", SnapshotReason.DISK, "policy:disk", datetime.now(UTC),
                            only_if_none_open=True)  # fmt: skip
    again = stops.request_snapshot(worker, "r2", SnapshotReason.DEADLINE, "policy:deadline",
                                    datetime.now(UTC), only_if_none_open=True)  # fmt: skip
    assert again.reason is SnapshotReason.DISK
    assert (Path(run.remote_dir) / "snapshot.request").read_text() == "disk"
    assert len(sent.named("runwarden.proof_timeout")) == 1  # one stop, one countdown


def test_a_policy_never_writes_over_a_request_already_in_the_run_directory(
    tmp_path: Path,
) -> None:
    worker, store, sent = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r3", limits=RunLimits(max_hours=0.5))
    request = Path(run.remote_dir) / "snapshot.request"
    request.write_text("deadline\n")  # the watchdog's, not seen by a tick yet
    stop = stops.request_snapshot(
        worker, "r3", SnapshotReason.DISK, "policy:disk", datetime.now(UTC), only_if_none_open=True
    )
    assert stop.reason is SnapshotReason.DEADLINE
    assert stop.asked_by == "watch"
    assert request.read_text() == "deadline\n"
    assert len(sent.named("runwarden.proof_timeout")) == 1


def test_the_disk_policy_probes_a_target_at_most_once_a_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, store, sent = policy_worker(tmp_path, disk_used_fraction=0.000001)
    running_run(store, tmp_path, "d1")
    probes: list[str] = []
    executor = worker.executor("local")
    real = executor.probe

    def counting(script: str) -> bytes:
        probes.append(script)
        return real(script)

    monkeypatch.setattr(executor, "probe", counting)
    policies.policy_target(worker, "local", datetime.now(UTC))
    policies.policy_target(worker, "local", datetime.now(UTC))
    assert len(probes) == 1
    (body,) = sent.named(TASK_SNAPSHOT_REQUEST)
    assert body["reason"] == "disk"
    assert body["asked_by"] == "policy:disk"


# --- the worker's retrieval ---------------------------------------------------------------------


def ended_run(store: RunStore, tmp_path: Path, run_id: str = "e1") -> RunRecord:
    run_dir = tmp_path / run_id
    (run_dir / "output" / "checkpoint-3").mkdir(parents=True)
    (run_dir / "output" / "checkpoint-3" / "weights.bin").write_bytes(os.urandom(5000))
    (run_dir / "job.log").write_text("hello\n")
    snap = {"checkpoint": "output/checkpoint-3", "step": 3, "time": 1.0, "reason": "requested"}
    (run_dir / "snapshot.json").write_text(json.dumps(snap))
    run = record(id=run_id, remote_dir=str(run_dir), job=JobId(dir=str(run_dir), pid=4242))
    assert store.create_run(run)
    return run


def test_a_finished_run_queues_its_retrieval_and_retries_with_backoff(tmp_path: Path) -> None:
    blocked = tmp_path / "artifacts"
    blocked.write_text("a file where the artifact store should be")
    worker, store, sent = policy_worker(
        tmp_path, artifact_dir=blocked, retrieve_backoff_s=10, retrieve_backoff_max_s=25,
        retrieve_attempts=4,
    )  # fmt: skip
    run = ended_run(store, tmp_path)
    ended = finish.finish(worker, run, JobStatus.CANCELLED, worker.executor("local"))
    assert ended.state is RunState.STOPPED
    assert ended.artifacts is not None
    assert ended.artifacts.phase is ArtifactsPhase.PENDING
    assert [RetrieveBody.model_validate(b).run_id for b in sent.named(TASK_RETRIEVE)] == ["e1"]
    now = datetime.now(UTC)
    waits = []
    for attempt in range(1, 5):
        result = retrieve(worker, "e1", now)
        assert result.attempts == attempt
        assert result.error
        # A duplicate task before the next attempt is due changes nothing.
        assert retrieve(worker, "e1", now) == result
        if attempt < 4:
            assert result.phase is ArtifactsPhase.PENDING
            assert result.next_attempt is not None
            waits.append(round((result.next_attempt - now).total_seconds()))
            assert store.due_retrievals(now) == []
            assert store.due_retrievals(result.next_attempt) == ["e1"]
            now = result.next_attempt
        else:
            assert result.phase is ArtifactsPhase.FAILED  # given up, and shown
            assert store.pending_retrievals() == []
    # A store that is not a directory needs a person: retried, but seldom.
    assert waits == [25, 25, 25]
    assert store.get_run("e1").artifacts == result
    # A person's retry, once the store is fixed, brings them home verified.
    blocked.unlink()
    done = retrieve(worker, "e1", now, force=True)
    assert done.phase is ArtifactsPhase.DONE, done
    assert done.files == 3
    assert (blocked / "e1" / "output" / "checkpoint-3" / "weights.bin").read_bytes() == (
        tmp_path / "e1" / "output" / "checkpoint-3" / "weights.bin"
    ).read_bytes()


def test_reconcile_sends_due_retrievals_once_per_lease(tmp_path: Path) -> None:
    worker, store, sent = policy_worker(tmp_path)
    store.schedule_retrieval("x1", datetime.now(UTC) - timedelta(seconds=1))
    stops.reconcile(worker, datetime.now(UTC))
    stops.reconcile(worker, datetime.now(UTC))
    assert [b["run_id"] for b in sent.named(TASK_RETRIEVE)] == ["x1"]


def test_a_retryable_failure_backs_off_doubling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, store, _ = policy_worker(
        tmp_path, retrieve_backoff_s=10, retrieve_backoff_max_s=35, retrieve_attempts=9
    )
    ended_run(store, tmp_path)
    store.transition("e1", RunState.FAILED, message="x")

    def broken(*args: object, **kwargs: object) -> None:
        raise RetrievalError("the connection dropped", retryable=True)

    monkeypatch.setattr("workers.artifacts.retrieve", broken)
    now = datetime.now(UTC)
    waits = []
    for _ in range(4):
        result = retrieve(worker, "e1", now)
        assert result.next_attempt is not None
        waits.append(round((result.next_attempt - now).total_seconds()))
        now = result.next_attempt
    assert waits == [10, 20, 35, 35]
    assert store.get_run("e1").artifacts.error == "the connection dropped"  # type: ignore[union-attr]
    assert store.get_run("e1").artifacts.attempts == 4  # type: ignore[union-attr]


def test_a_killed_retrieval_still_counts_its_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, store, _ = policy_worker(tmp_path)
    ended_run(store, tmp_path)
    store.transition("e1", RunState.FAILED, message="x")

    def killed(*args: object, **kwargs: object) -> None:
        raise SystemExit("the worker is going away")  # not an Exception: not recorded

    monkeypatch.setattr("workers.artifacts.retrieve", killed)
    with pytest.raises(SystemExit):
        retrieve(worker, "e1", datetime.now(UTC))
    artifacts = store.get_run("e1").artifacts
    assert artifacts is not None
    assert artifacts.attempts == 1
    assert artifacts.phase is ArtifactsPhase.PENDING
    # The lock is released: the next one may try once the lease ends.
    assert store.lock("retrieve:e1", "other", 5)


def test_a_retrieval_held_by_another_is_left_alone_and_a_forced_one_says_so(
    tmp_path: Path,
) -> None:
    worker, store, _ = policy_worker(tmp_path)
    ended_run(store, tmp_path)
    store.transition("e1", RunState.FAILED, message="x")
    assert store.lock("retrieve:e1", "someone-else", 60)
    before = store.get_run("e1").artifacts
    assert retrieve(worker, "e1", datetime.now(UTC)) == before
    with pytest.raises(Conflict, match="running now"):
        retrieve(worker, "e1", datetime.now(UTC), force=True)
    assert not store.unlock("retrieve:e1", "not-the-holder")
    assert store.unlock("retrieve:e1", "someone-else")


def test_the_end_and_the_queued_retrieval_are_one_transaction(tmp_path: Path) -> None:
    _, store, _ = policy_worker(tmp_path)
    ended_run(store, tmp_path)
    ended = store.transition("e1", RunState.CANCELLED)
    assert ended.artifacts is not None
    assert ended.artifacts.phase is ArtifactsPhase.PENDING
    assert [r for r, _ in store.pending_retrievals()] == ["e1"]
    # A run that never had a job has nothing to retrieve.
    assert store.create_run(record(id="nojob", job=None, state=RunState.PREPARING))
    assert store.transition("nojob", RunState.FAILED).artifacts is None


def test_a_forced_retrieval_replaces_a_damaged_copy_and_keeps_it_aside(tmp_path: Path) -> None:
    worker, store, _ = policy_worker(tmp_path)
    ended_run(store, tmp_path)
    store.transition("e1", RunState.SUCCEEDED)
    assert retrieve(worker, "e1", datetime.now(UTC)).phase is ArtifactsPhase.DONE
    home = worker.settings.artifacts_root / "e1"
    (home / "job.log").write_text("changed size")
    # Not forced: done stays done.
    assert retrieve(worker, "e1", datetime.now(UTC)).phase is ArtifactsPhase.DONE
    again = retrieve(worker, "e1", datetime.now(UTC), force=True)
    assert again.phase is ArtifactsPhase.DONE
    assert (home / "job.log").read_text() == "hello\n"
    assert [p.name.split(".")[0] for p in home.parent.glob("e1.damaged-*")] == ["e1"]


def test_a_done_retrieval_needs_no_target_to_be_recorded_again(tmp_path: Path) -> None:
    worker, store, _ = policy_worker(tmp_path)
    ended_run(store, tmp_path)
    store.transition("e1", RunState.SUCCEEDED)
    assert retrieve(worker, "e1", datetime.now(UTC)).phase is ArtifactsPhase.DONE
    store.remove_target("local")
    assert retrieve(worker, "e1", datetime.now(UTC), force=True).phase is ArtifactsPhase.DONE
