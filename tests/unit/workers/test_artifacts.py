"""`workers.artifacts`: a finished run's retrieval is queued with its end, retried with
backoff, counted even when killed, held by one worker at a time, resent by
reconcile, and forced by a person."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from schemas import ArtifactsPhase, Conflict, JobStatus, RunState
from schemas.events import TASK_RETRIEVE, RetrieveBody
from workers import finish, reconcile
from workers.artifacts import retrieve_artifacts as retrieve
from workers.errors import RetrievalError

from .conftest import ended_run, policy_worker


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
            assert store.retrievals.due(now) == []
            assert store.retrievals.due(result.next_attempt) == ["e1"]
            now = result.next_attempt
        else:
            assert result.phase is ArtifactsPhase.FAILED  # given up, and shown
            assert store.retrievals.pending() == []
    # A store that is not a directory needs a person: retried, but seldom.
    assert waits == [25, 25, 25]
    assert store.runs.get("e1").artifacts == result
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
    store.retrievals.schedule("x1", datetime.now(UTC) - timedelta(seconds=1))
    reconcile.reconcile(worker, datetime.now(UTC))
    reconcile.reconcile(worker, datetime.now(UTC))
    assert [b["run_id"] for b in sent.named(TASK_RETRIEVE)] == ["x1"]


def test_a_retryable_failure_backs_off_doubling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, store, _ = policy_worker(
        tmp_path, retrieve_backoff_s=10, retrieve_backoff_max_s=35, retrieve_attempts=9
    )
    ended_run(store, tmp_path)
    store.runs.transition("e1", RunState.FAILED, message="x")

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
    assert store.runs.get("e1").artifacts.error == "the connection dropped"  # type: ignore[union-attr]
    assert store.runs.get("e1").artifacts.attempts == 4  # type: ignore[union-attr]


def test_a_killed_retrieval_still_counts_its_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, store, _ = policy_worker(tmp_path)
    ended_run(store, tmp_path)
    store.runs.transition("e1", RunState.FAILED, message="x")

    def killed(*args: object, **kwargs: object) -> None:
        raise SystemExit("the worker is going away")  # not an Exception: not recorded

    monkeypatch.setattr("workers.artifacts.retrieve", killed)
    with pytest.raises(SystemExit):
        retrieve(worker, "e1", datetime.now(UTC))
    artifacts = store.runs.get("e1").artifacts
    assert artifacts is not None
    assert artifacts.attempts == 1
    assert artifacts.phase is ArtifactsPhase.PENDING
    # The lock is released: the next one may try once the lease ends.
    assert store.locks.lock("retrieve:e1", "other", 5)


def test_a_retrieval_held_by_another_is_left_alone_and_a_forced_one_says_so(
    tmp_path: Path,
) -> None:
    worker, store, _ = policy_worker(tmp_path)
    ended_run(store, tmp_path)
    store.runs.transition("e1", RunState.FAILED, message="x")
    assert store.locks.lock("retrieve:e1", "someone-else", 60)
    before = store.runs.get("e1").artifacts
    assert retrieve(worker, "e1", datetime.now(UTC)) == before
    with pytest.raises(Conflict, match="running now"):
        retrieve(worker, "e1", datetime.now(UTC), force=True)
    assert not store.locks.unlock("retrieve:e1", "not-the-holder")
    assert store.locks.unlock("retrieve:e1", "someone-else")


def test_a_forced_retrieval_replaces_a_damaged_copy_and_keeps_it_aside(tmp_path: Path) -> None:
    worker, store, _ = policy_worker(tmp_path)
    ended_run(store, tmp_path)
    store.runs.transition("e1", RunState.SUCCEEDED)
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
    store.runs.transition("e1", RunState.SUCCEEDED)
    assert retrieve(worker, "e1", datetime.now(UTC)).phase is ArtifactsPhase.DONE
    store.targets.remove("local")
    assert retrieve(worker, "e1", datetime.now(UTC), force=True).phase is ArtifactsPhase.DONE


@pytest.mark.parametrize("how", ["link", "gone"])
def test_a_retrieval_without_the_snapshot_s_checkpoint_is_failed_never_done(
    tmp_path: Path, how: str
) -> None:
    worker, store, _ = policy_worker(tmp_path, artifact_dir=tmp_path / "artifacts")
    run = ended_run(store, tmp_path)
    ended = finish.finish(worker, run, JobStatus.CANCELLED, worker.executor("local"))
    assert ended.state is RunState.STOPPED  # its checkpoint was real at the end
    checkpoint = tmp_path / "e1" / "output" / "checkpoint-3"
    for child in checkpoint.iterdir():
        child.unlink()
    checkpoint.rmdir()
    if how == "link":  # the job (or anyone) swapped it for a link since
        checkpoint.symlink_to("/etc")
    result = retrieve(worker, "e1", datetime.now(UTC))
    assert result.phase is ArtifactsPhase.FAILED
    assert result.error is not None
    assert "the checkpoint output/checkpoint-3 did not come home" in result.error
    assert store.runs.get("e1").artifacts == result
    kinds = [e.kind for e in store.ledger.events("e1")]
    assert kinds[-1] == "retrieval_failed"
    assert "retrieval_done" not in kinds
