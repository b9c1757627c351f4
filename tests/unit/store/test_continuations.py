"""`store.continuations`: the queue of preempted runs waiting to be continued, kept in
step with their records in the transaction that writes them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from schemas import RunState, Snapshot, SnapshotReason
from schemas.chain import ContinuationPhase, OnPreempt
from store import RunStore

from .conftest import T0, running

PREEMPTED = Snapshot(checkpoint="output/checkpoint-9", step=9, reason=SnapshotReason.PREEMPTED)
LATER = T0 + timedelta(days=3650)  # after any real clock of the test


@pytest.mark.parametrize("how", ["end_run", "apply_transition"])
def test_a_preempted_run_with_a_plan_is_queued_by_its_end(store: RunStore, how: str) -> None:
    running(store, "a", on_preempt=OnPreempt())
    running(store, "b")  # no plan
    running(store, "c", on_preempt=OnPreempt())
    end = store.end_run if how == "end_run" else store.apply_transition
    end("a", RunState.STOPPED, snapshot=PREEMPTED)
    end("b", RunState.STOPPED, snapshot=PREEMPTED)
    end("c", RunState.CANCELLED)
    assert store.due_continuations(LATER) == ["a"]
    waiting = store.get_run("a").continuation
    assert waiting is not None
    assert waiting.phase is ContinuationPhase.WAITING


def test_the_queue_follows_the_record_and_moves_only_waiting_entries(store: RunStore) -> None:
    running(store, "a", on_preempt=OnPreempt())
    store.end_run("a", RunState.STOPPED, snapshot=PREEMPTED)
    assert store.schedule_continuation("a", LATER)  # moved ahead
    assert store.due_continuations(LATER - timedelta(seconds=1)) == []
    assert store.due_continuations(LATER) == ["a"]

    def launched(run):  # type: ignore[no-untyped-def]
        assert run.continuation is not None
        done = run.continuation.model_copy(update={"phase": ContinuationPhase.LAUNCHED})
        return run.model_copy(update={"continuation": done})

    store.update_run("a", launched)
    assert store.due_continuations(LATER) == []
    # An entry that left the queue is not put back by a late move.
    assert not store.schedule_continuation("a", T0)
    assert store.due_continuations(LATER) == []
    with pytest.raises(ValueError, match="run id"):
        store.schedule_continuation("../evil", T0)
