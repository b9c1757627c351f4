"""`store.retrievals`: the queue of retrievals due."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import RunStore

from ..conftest import T0


def test_the_retrieval_queue_returns_due_runs_until_dropped(store: RunStore) -> None:
    store.retrievals.schedule("a", T0)
    store.retrievals.schedule("b", T0 + timedelta(seconds=30))
    assert store.retrievals.due(T0) == ["a"]
    assert store.retrievals.due(T0 + timedelta(minutes=1)) == ["a", "b"]
    store.retrievals.schedule("a", T0 + timedelta(hours=1))  # moved on, not added twice
    assert store.retrievals.due(T0 + timedelta(minutes=1)) == ["b"]
    assert [r for r, _ in store.retrievals.pending()] == ["b", "a"]
    assert store.retrievals.drop("b")
    assert not store.retrievals.drop("b")
    with pytest.raises(ValueError, match="run id"):
        store.retrievals.schedule("../evil", T0)
