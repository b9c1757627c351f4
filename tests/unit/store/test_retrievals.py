"""`store.retrievals`: the queue of retrievals due."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import RunStore

from ..conftest import T0


def test_the_retrieval_queue_returns_due_runs_until_dropped(store: RunStore) -> None:
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
