"""`workers.chain`: a preempted run is continued from its verified checkpoint on the
first available target of its plan, once; its chain's preemptions are counted and
capped; a checkpoint that could not be retrieved, or no target, declines it."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.harness.users import as_the_worker
from schemas import ArtifactsPhase, JobId, JobStatus, RunRecord, RunState
from schemas.auth import WORKER
from schemas.chain import CONTINUE_RETRY_S, ContinuationPhase, OnPreempt, continuation_key
from schemas.events import TASK_CONTINUE, TASK_LAUNCH, LaunchSpec
from schemas.idempotency import owned_launch_key
from store import RunStore
from workers import finish
from workers.artifacts import retrieve_artifacts
from workers.chain import CONTINUE_GIVE_UP_S, continue_run
from workers.context import Context
from workers.reconcile import continue_due

from ...conftest import put_signed_target
from ..conftest import record
from .conftest import Sent, policy_worker


def preempted_run(
    ctx: Context, store: RunStore, tmp_path: Path, run_id: str = "p1", **fields: Any
) -> RunRecord:
    """A run on `local` whose job saved for `preempted` and exited 0, ended through
    `finish` as the follow ends it."""
    run_dir = tmp_path / "local" / run_id
    (run_dir / "output" / "checkpoint-5").mkdir(parents=True)
    (run_dir / "output" / "checkpoint-5" / "weights.bin").write_bytes(os.urandom(3000))
    (run_dir / "job.log").write_text("saved\n")
    proof = {"checkpoint": "output/checkpoint-5", "step": 5, "time": 1.0, "reason": "preempted"}
    (run_dir / "snapshot.json").write_text(json.dumps(proof))
    base: dict[str, Any] = {
        "id": run_id,
        "remote_dir": str(run_dir),
        "job": JobId(dir=str(run_dir), pid=4242),
        "command": "python train.py",
        "on_preempt": OnPreempt(targets=("local", "spare")),
    }
    base.update(fields)
    run = record(**base)
    assert store.runs.create(run)
    return finish.finish(ctx, run, JobStatus.exited(0), ctx.executor("local"))


def worker(tmp_path: Path, **settings: Any) -> tuple[Context, RunStore, Sent]:
    (tmp_path / "local").mkdir()
    (tmp_path / "spare").mkdir()
    ctx, store, sent = policy_worker(tmp_path, **settings)
    for name in ("local", "spare"):
        config = {"name": name, "kind": "local", "workdir": str(tmp_path / name)}
        put_signed_target(store, ctx.settings, {**config, **as_the_worker()})
    return ctx, store, sent


def test_continued_on_the_next_target_once_its_checkpoint_is_verified(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path)
    run = preempted_run(ctx, store, tmp_path)
    assert run.state is RunState.STOPPED
    assert run.continuation is not None
    assert run.continuation.phase is ContinuationPhase.WAITING
    now = datetime.now(UTC)
    # Before its retrieval: it waits, and nothing is launched.
    assert continue_run(ctx, run.id, now) == run.continuation
    assert sent.named(TASK_LAUNCH) == []
    # The retrieval, once done, sends the continuation.
    assert retrieve_artifacts(ctx, run.id, now).phase is ArtifactsPhase.DONE
    assert sent.named(TASK_CONTINUE) == [{"run_id": run.id}]
    done = continue_run(ctx, run.id, now)
    assert done is not None
    assert done.phase is ContinuationPhase.LAUNCHED
    assert done.target == "spare"  # not the target it was just preempted on
    # Stored as the workers' own key: no producer can take it first.
    assert done.key == owned_launch_key(WORKER, continuation_key(run.id))
    [body] = sent.named(TASK_LAUNCH)
    spec = LaunchSpec.model_validate(body)
    assert spec.target == "spare"
    assert spec.resume_from == run.id
    assert spec.command == run.command
    assert spec.on_preempt == run.on_preempt
    assert spec.key == continuation_key(run.id)
    assert store.continuations.due(now + timedelta(days=1)) == []
    # Sent again (a duplicate, reconcile): nothing more.
    assert continue_run(ctx, run.id, now) == done
    assert len(sent.named(TASK_LAUNCH)) == 1


def test_the_chain_s_preemptions_are_capped(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path)
    plan = OnPreempt(targets=("spare",), max_preemptions=2)
    run = preempted_run(ctx, store, tmp_path, on_preempt=plan, chain_preemptions=2)
    assert run.continuation is not None
    assert run.continuation.preemptions == 3
    now = datetime.now(UTC)
    retrieve_artifacts(ctx, run.id, now)
    declined = continue_run(ctx, run.id, now)
    assert declined is not None
    assert declined.phase is ContinuationPhase.DECLINED
    assert declined.reason is not None
    assert "at most 2" in declined.reason
    assert sent.named(TASK_LAUNCH) == []


def test_a_checkpoint_that_could_not_be_retrieved_declines_it(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path, retrieve_attempts=1)
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "runs").write_text("not a directory")  # retrieval fails
    run = preempted_run(ctx, store, tmp_path)
    now = datetime.now(UTC)
    assert retrieve_artifacts(ctx, run.id, now).phase is ArtifactsPhase.FAILED
    declined = continue_run(ctx, run.id, now)
    assert declined is not None
    assert declined.phase is ContinuationPhase.DECLINED
    assert declined.reason is not None
    assert "could not be retrieved" in declined.reason
    assert sent.named(TASK_LAUNCH) == []


def test_with_no_target_available_it_waits_then_gives_up(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path)
    # `gone` is not defined; `spare` does not allow the run's secret.
    plan = OnPreempt(targets=("gone", "spare"))
    run = preempted_run(ctx, store, tmp_path, on_preempt=plan, secrets=("HF_TOKEN",))
    now = datetime.now(UTC)
    retrieve_artifacts(ctx, run.id, now)
    waiting = continue_run(ctx, run.id, now)
    assert waiting is not None
    assert waiting.phase is ContinuationPhase.WAITING
    assert waiting.reason is not None
    assert "gone" in waiting.reason, waiting.reason
    assert "HF_TOKEN" in waiting.reason, waiting.reason
    assert sent.named(TASK_LAUNCH) == []
    # Tried again after the retry wait, from reconcile.
    assert store.continuations.due(now) == []
    later = now + timedelta(seconds=CONTINUE_RETRY_S + 1)
    sent.calls.clear()
    assert continue_due(ctx, later) == 1
    assert sent.named(TASK_CONTINUE) == [{"run_id": run.id}]
    assert store.continuations.due(later) == []  # moved ahead while the task waits
    # Given up a day after the run ended.
    ended = store.runs.get(run.id).ended
    assert ended is not None
    final = continue_run(ctx, run.id, ended + timedelta(seconds=CONTINUE_GIVE_UP_S))
    assert final is not None
    assert final.phase is ContinuationPhase.DECLINED
    assert store.continuations.due(later + timedelta(days=2)) == []


def test_a_run_without_a_plan_or_not_preempted_is_never_continued(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path)
    run = preempted_run(ctx, store, tmp_path, on_preempt=None)
    assert run.continuation is None
    now = datetime.now(UTC)
    retrieve_artifacts(ctx, run.id, now)
    assert continue_run(ctx, run.id, now) is None
    assert sent.named(TASK_CONTINUE) == []
    assert sent.named(TASK_LAUNCH) == []
