"""`store.continuations`: the queue of preempted runs waiting to be continued, kept in
step with their records in the transaction that writes them."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest

from schemas import RunState, Snapshot, SnapshotReason
from schemas.chain import ContinuationPhase, OnPreempt
from store import RunStore
from store.steps import end_run

from .conftest import T0, running

PREEMPTED = Snapshot(checkpoint="output/checkpoint-9", step=9, reason=SnapshotReason.PREEMPTED)
LATER = T0 + timedelta(days=3650)  # after any real clock of the test


@pytest.mark.parametrize("how", ["end_run", "apply_transition"])
def test_a_preempted_run_with_a_plan_is_queued_by_its_end(store: RunStore, how: str) -> None:
    running(store, "a", on_preempt=OnPreempt())
    running(store, "b")  # no plan
    running(store, "c", on_preempt=OnPreempt())
    end = functools.partial(end_run, store) if how == "end_run" else store.runs.apply_transition
    end("a", RunState.STOPPED, snapshot=PREEMPTED)
    end("b", RunState.STOPPED, snapshot=PREEMPTED)
    end("c", RunState.CANCELLED)
    assert store.continuations.due(LATER) == ["a"]
    waiting = store.runs.get("a").continuation
    assert waiting is not None
    assert waiting.phase is ContinuationPhase.WAITING


def test_the_queue_follows_the_record_and_moves_only_waiting_entries(store: RunStore) -> None:
    running(store, "a", on_preempt=OnPreempt())
    end_run(store, "a", RunState.STOPPED, snapshot=PREEMPTED)
    assert store.continuations.schedule("a", LATER)  # moved ahead
    assert store.continuations.due(LATER - timedelta(seconds=1)) == []
    assert store.continuations.due(LATER) == ["a"]

    def launched(run):  # type: ignore[no-untyped-def]
        assert run.continuation is not None
        done = run.continuation.model_copy(update={"phase": ContinuationPhase.LAUNCHED})
        return run.model_copy(update={"continuation": done})

    store.runs.update("a", launched)
    assert store.continuations.due(LATER) == []
    # An entry that left the queue is not put back by a late move.
    assert not store.continuations.schedule("a", T0)
    assert store.continuations.due(LATER) == []
    with pytest.raises(ValueError, match="run id"):
        store.continuations.schedule("../evil", T0)
