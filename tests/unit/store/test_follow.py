"""`store.follow.add`: followed runs, their read offsets, and their log and metrics
streams (capped, ordered, strict JSON), written once per tail read. Their bounds in
bytes and their retention: test_bounds.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from schemas import Progress
from schemas.errors import NotFound
from store import LogEntry, Offsets, RunStore

from .conftest import race, record, xlen

# --- followed runs ----------------------------------------------------------------


def test_follow_and_unfollow(store: RunStore) -> None:
    store.runs.create(record("r1", target="a"))
    store.runs.create(record("r2", target="a"))
    store.runs.create(record("r3", target="b"))
    for run_id in ("r1", "r2", "r3", "r1"):
        store.follow.add(run_id)
    assert store.follow.runs("a") == ["r1", "r2"]
    assert store.follow.targets() == ["a", "b"]
    assert store.follow.remove("r3")
    assert not store.follow.remove("r3")
    assert store.follow.targets() == ["a"]
    assert store.follow.remove("r1")
    assert store.follow.runs("a") == ["r2"]
    with pytest.raises(NotFound):
        store.follow.add("r9")


def test_offsets(store: RunStore) -> None:
    assert store.follow.offsets("r1") == Offsets(0, 0)
    store.follow.set_offsets("r1", 120, 40)
    assert store.follow.offsets("r1") == Offsets(log=120, metrics=40)
    with pytest.raises(ValueError, match="non-negative"):
        store.follow.set_offsets("r1", -1, 0)


def test_record_tail_appends_once(store: RunStore) -> None:
    start, end = Offsets(0, 0), Offsets(12, 30)
    lines, records = ["a", "b"], [{"event": "begin", "time": 1.0, "max_steps": 10}]
    assert store.follow.record_tail(
        "r1", lines=lines, records=records, from_offsets=start, to_offsets=end
    )
    # A second follower that read the same bytes finds the offsets moved: nothing twice.
    assert not store.follow.record_tail(
        "r1", lines=lines, records=records, from_offsets=start, to_offsets=end
    )
    assert [e.line for e in store.follow.read_log("r1")] == ["a", "b"]
    assert len(store.follow.read_metrics("r1")) == 1
    assert store.follow.offsets("r1") == end
    results = race(
        [
            lambda: store.follow.record_tail(
                "r1", lines=["c"], records=[], from_offsets=end, to_offsets=Offsets(14, 30)
            )
        ]
        * 3
    )
    assert sorted(map(bool, results)) == [False, False, True]
    assert [e.line for e in store.follow.read_log("r1")] == ["a", "b", "c"]


# --- streams ----------------------------------------------------------------------


def test_log_stream_is_capped_and_ordered(make_store: Callable[..., RunStore]) -> None:
    store = make_store(log_cap=1000)
    for batch in range(30):
        store.follow.append_log("r1", [f"line {batch * 100 + i}" for i in range(100)])
    length = xlen(store, "rw:log:r1")
    assert length == 1000  # exactly: the oldest entries past the cap are trimmed
    entries = store.follow.read_log("r1", count=5000)
    assert len(entries) == length
    assert entries[-1].line == "line 2999"
    assert [int(e.line.split()[1]) for e in entries] == list(range(3000 - length, 3000))
    page = store.follow.read_log("r1", after_id=entries[10].id, count=3)
    assert page == entries[11:14]
    assert store.follow.read_log("r1", after_id=entries[-1].id) == []


def test_read_log_newest_gives_the_newest_lines_oldest_first(store: RunStore) -> None:
    assert store.follow.read_log_newest("r1") == []
    store.follow.append_log("r1", [f"line {i}" for i in range(2500)])
    newest = store.follow.read_log_newest("r1")
    assert [e.line for e in newest] == [f"line {i}" for i in range(1500, 2500)]
    assert [e.line for e in store.follow.read_log_newest("r1", count=3)] == [
        "line 2497", "line 2498", "line 2499"
    ]  # fmt: skip
    assert store.follow.read_log_newest("r1", count=10_000) == store.follow.read_log(
        "r1", count=10_000
    )
    # Read on from the last line, as `logs -f` does.
    store.follow.append_log("r1", ["line 2500"])
    assert [e.line for e in store.follow.read_log("r1", after_id=newest[-1].id)] == ["line 2500"]
    with pytest.raises(ValueError, match="at least 1"):
        store.follow.read_log_newest("r1", count=0)


def test_metrics_stream_capped_and_progress_kept(make_store: Callable[..., RunStore]) -> None:
    store = make_store(metrics_cap=500)
    assert store.follow.last_metrics("r1") is None
    store.follow.append_metrics("r1", [{"event": "begin", "time": 1.0, "max_steps": 3000}])
    for batch in range(20):
        store.follow.append_metrics(
            "r1",
            [
                {"event": "log", "time": 2.0 + s, "step": s, "loss": 1.0 / (s + 1)}
                for s in range(batch * 100, batch * 100 + 100)
            ]
            + [{"event": "log", "time": 3000.0, "step": batch * 100 + 99, "lr": 0.1}],
        )
    assert xlen(store, "rw:metrics:r1") == 500
    assert store.follow.last_metrics("r1") == Progress(
        max_steps=3000, step=1999, loss=1.0 / 2000, loss_step=1999, time=3000.0, ended=False
    )
    last = store.follow.read_metrics("r1", count=10_000)[-1]
    assert last.record == {"event": "log", "time": 3000.0, "step": 1999, "lr": 0.1}
    store.follow.append_metrics("r1", [{"event": "end", "time": 4000.0, "step": 2000}])
    progress = store.follow.last_metrics("r1")
    assert progress is not None
    assert (progress.ended, progress.step, progress.loss_step) == (True, 2000, 1999)


def test_metrics_are_strict_json(store: RunStore) -> None:
    store.follow.append_metrics(
        "r1", [{"event": "log", "step": 1, "loss": float("nan"), "x": [1.5]}]
    )
    (entry,) = store.follow.read_metrics("r1")
    assert entry.record == {"event": "log", "step": 1, "loss": None, "x": [1.5]}
    progress = store.follow.last_metrics("r1")
    assert progress is not None
    assert (progress.step, progress.loss) == (1, None)
    with pytest.raises(TypeError):
        store.follow.append_metrics("r1", [{"event": "log", "bad": object()}])
    assert len(store.follow.read_metrics("r1")) == 1


def test_log_lines_any_text(store: RunStore) -> None:
    lines = ["", "tab\tand ünïcode ✓", "lone \udcff surrogate", "x" * 100_000]
    assert store.follow.append_log("r1", lines) is not None
    assert store.follow.append_log("r1", []) is None
    got = [e.line for e in store.follow.read_log("r1")]
    cut = " [runwarden: line cut, 100000 bytes]"
    assert got == ["", "tab\tand ünïcode ✓", "lone ? surrogate", "x" * (8000 - len(cut)) + cut]


def test_read_log_blocking(store: RunStore) -> None:
    store.follow.append_log("r1", ["a"])
    (first,) = store.follow.read_log("r1", block_ms=1000)
    assert first.line == "a"
    started = time.monotonic()
    assert store.follow.read_log("r1", after_id=first.id, block_ms=200) == []
    assert time.monotonic() - started < 3

    def later() -> None:
        time.sleep(0.2)
        store.follow.append_log("r1", ["b"])

    thread = threading.Thread(target=later)
    thread.start()
    got = store.follow.read_log("r1", after_id=first.id, block_ms=5000)
    thread.join()
    assert [e.line for e in got] == ["b"]
    assert isinstance(got[0], LogEntry)
