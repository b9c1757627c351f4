"""`workers.artifacts` with the artifact store's limits: a retrieval that would pass the
disk reserve or a quota is recorded failed at once with the reason (no retry by
itself: a person acts), leaves nothing in the store and the target's copy as it was,
and a person's `runwarden retrieve` brings it home once the limit allows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from schemas import ArtifactsPhase, JobStatus
from workers import finish, reconcile
from workers.artifacts import retrieve_artifacts as retrieve
from workers.context import Context
from workers.retrieval.quota import free_bytes

from .conftest import ended_run, policy_worker


def test_past_the_reserve_the_retrieval_fails_at_once_and_a_person_retries(
    tmp_path: Path,
) -> None:
    reserve = free_bytes(tmp_path) + 1024**4
    worker, store, sent = policy_worker(tmp_path, artifact_reserve_bytes=reserve)
    run = ended_run(store, tmp_path)
    finish.finish(worker, run, JobStatus.CANCELLED, worker.executor("local"))
    now = datetime.now(UTC)

    result = retrieve(worker, "e1", now)
    assert result.phase is ArtifactsPhase.FAILED
    assert result.attempts == 1
    assert result.error is not None
    assert "RUNWARDEN_ARTIFACT_RESERVE_BYTES" in result.error
    assert "runwarden retrieve e1" in result.error
    assert store.runs.get("e1").artifacts == result
    # Not tried again by itself: out of the retrieval queue; a duplicate task or a
    # reconcile much later changes nothing.
    assert store.retrievals.pending() == []
    later = now + timedelta(days=1)
    reconcile.reconcile(worker, later)
    assert retrieve(worker, "e1", later) == result
    root = worker.settings.artifacts_root
    assert not root.exists() or list(root.iterdir()) == []
    weights = tmp_path / "e1" / "output" / "checkpoint-3" / "weights.bin"
    assert weights.stat().st_size == 5000  # the target's copy is kept

    # Space freed (here: the reserve lowered), a person retries.
    freed = Context(store, worker.settings.model_copy(update={"artifact_reserve_bytes": 0}),
                    sent, "w")  # fmt: skip
    done = retrieve(freed, "e1", later, force=True)
    assert done.phase is ArtifactsPhase.DONE, done
    assert (root / "e1" / "output" / "checkpoint-3" / "weights.bin").read_bytes() == (
        weights.read_bytes()
    )


def test_past_the_run_quota_the_retrieval_fails_with_the_setting_named(tmp_path: Path) -> None:
    worker, store, _ = policy_worker(tmp_path, artifact_quota_run_bytes=1000)
    run = ended_run(store, tmp_path)
    finish.finish(worker, run, JobStatus.CANCELLED, worker.executor("local"))
    result = retrieve(worker, "e1", datetime.now(UTC))
    assert result.phase is ArtifactsPhase.FAILED
    assert result.error is not None
    assert "RUNWARDEN_ARTIFACT_QUOTA_RUN_BYTES" in result.error
