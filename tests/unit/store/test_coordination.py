"""`store.coordination`: effects done once per key and time."""

from __future__ import annotations

import time

from store import RunStore

from .conftest import race


def test_once(store: RunStore) -> None:
    assert store.locks.once("cancel:r1:abc", 0.3)
    assert not store.locks.once("cancel:r1:abc", 10)
    assert store.locks.once("cancel:r1:other", 10)
    time.sleep(0.4)
    assert store.locks.once("cancel:r1:abc", 10)
    assert store.locks.forget("cancel:r1:abc")
    assert store.locks.once("cancel:r1:abc", 10)
    results = race([lambda: store.locks.once("effect", 10)] * 5)
    assert sorted(map(bool, results)) == [False] * 4 + [True]
