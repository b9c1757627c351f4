"""Redis stays bounded (`store.streams`, `store/lua/append_stream.lua`, `steps.end_run`): each
run's log and metrics streams keep at most their byte budget, the oldest entries
dropped first, exactly, with the offsets still exact; lines are cut to the line cap
at a character boundary; an ended run's follow data expires after the retention
while its record and stop history stay. Over fake and real Redis (conftest)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from schemas import RunState, SnapshotReason
from store import Offsets, RunStore
from store.steps import end_run
from store.streams import CUT_MARK, ENTRY_OVERHEAD_BYTES, cut_line

from ...conftest import wait_for
from .conftest import SNAP, T0, running

KIB = 1024


def held(store: RunStore, run_id: str, name: str) -> int:
    """The bytes the store says a stream holds."""
    return int(getattr(store.follow.stream_bytes(run_id), name))


def counted(store: RunStore, key: str) -> int:
    """The bytes a stream holds, counted entry by entry as the store counts them."""
    entries: Any = store.client.xrange(key)
    return sum(
        ENTRY_OVERHEAD_BYTES + sum(len(v) for v in fields.values()) for _, fields in entries
    )


def entry_size(line: str, line_bytes: int) -> int:
    return len(cut_line(line, line_bytes)) + ENTRY_OVERHEAD_BYTES


# --- the line cap -----------------------------------------------------------------


@pytest.mark.parametrize("char", ["x", "é", "✓", "🙂"])
def test_a_long_line_is_cut_at_a_character_boundary_and_marked(char: str) -> None:
    for cap in range(64, 96):
        line = char * 200
        data = cut_line(line, cap)
        mark = CUT_MARK.format(len(line.encode())).encode()
        assert len(data) <= cap
        assert data.endswith(mark)
        kept = data[: -len(mark)].decode("utf-8")  # never a split character
        assert kept == char * len(kept)
        assert len(data) > cap - len(char.encode())  # as much as fits
    assert cut_line("short ✓", 64) == "short ✓".encode()
    assert cut_line("lone \udcff", 64) == b"lone ?"


def test_a_line_above_the_cap_is_stored_cut(make_store: Callable[..., RunStore]) -> None:
    store = make_store(line_bytes=1000, log_bytes=64 * KIB)
    store.follow.append_log("r1", ["é" * 5000, "ok"])
    long, short = (e.line for e in store.follow.read_log("r1"))
    assert len(long.encode()) <= 1000
    assert long.startswith("é" * 100)
    assert long.endswith(CUT_MARK.format(10_000))
    assert short == "ok"


# --- byte budgets -----------------------------------------------------------------


def test_a_run_writing_far_more_than_its_budget_keeps_at_most_its_budget(
    make_store: Callable[..., RunStore],
) -> None:
    budget, line_bytes = 64 * KIB, 2000
    store = make_store(log_bytes=budget, line_bytes=line_bytes)
    rng = random.Random(7)
    offset, written, sent = Offsets(0, 0), [], 0
    for tick in range(120):
        lines = [
            f"{tick:04d}.{i:03d} " + rng.choice("aé✓") * rng.choice([0, 10, 80, 300, 3000])
            for i in range(rng.randint(1, 40))
        ]
        size = sum(len(line.encode()) + 1 for line in lines)
        to = Offsets(offset.log + size, 0)
        assert store.follow.record_tail(
            "r1", lines=lines, records=[], from_offsets=offset, to_offsets=to
        )
        # The same bytes again (a second follower): never appended twice.
        assert not store.follow.record_tail(
            "r1", lines=lines, records=[], from_offsets=offset, to_offsets=to
        )
        offset, sent = to, sent + size
        written += lines
        assert counted(store, "rw:log:r1") <= budget
        assert held(store, "r1", "log") == counted(store, "rw:log:r1")
    assert sent > 20 * budget
    assert store.follow.offsets("r1") == offset  # exact, whatever was trimmed

    kept = [e.line for e in store.follow.read_log("r1", count=100_000)]
    expected = [cut_line(line, line_bytes).decode() for line in written]
    # The newest lines, in order, the oldest dropped first ...
    assert kept == expected[len(expected) - len(kept) :]
    # ... exactly: the next older line would not have fitted.
    older = written[len(expected) - len(kept) - 1]
    assert counted(store, "rw:log:r1") + entry_size(older, line_bytes) > budget


def test_the_metrics_stream_keeps_its_budget_and_leaves_out_oversized_records(
    make_store: Callable[..., RunStore],
) -> None:
    budget = 64 * KIB
    store = make_store(metrics_bytes=budget, line_bytes=1000)
    store.follow.append_metrics("r1", [{"event": "begin", "time": 0.0, "max_steps": 10_000}])
    for step in range(0, 2000, 50):
        store.follow.append_metrics(
            "r1",
            [
                {"event": "log", "time": float(s), "step": s, "loss": 1.0, "note": "n" * 200}
                for s in range(step, step + 50)
            ],
        )
        assert counted(store, "rw:metrics:r1") <= budget
        assert held(store, "r1", "metrics") == counted(store, "rw:metrics:r1")
    records = [m.record for m in store.follow.read_metrics("r1", count=10_000)]
    assert records[-1]["step"] == 1999
    assert [r["step"] for r in records] == list(range(2000 - len(records), 2000))
    # A record longer than the line cap is left out of the stream; its progress counts.
    assert (
        store.follow.append_metrics("r1", [{"event": "log", "step": 5000, "x": "y" * 2000}]) is None
    )
    assert store.follow.read_metrics("r1", count=10_000)[-1].record["step"] == 1999
    progress = store.follow.last_metrics("r1")
    assert progress is not None
    assert (progress.step, progress.max_steps) == (5000, 10_000)


def test_a_stream_written_before_bytes_were_counted_goes_on_and_ages_out(
    make_store: Callable[..., RunStore],
) -> None:
    """A stream of an older version (time ids, no counter) takes new lines after its
    own, and its old entries go once a budget's worth of new ones came."""
    budget = 64 * KIB
    store = make_store(log_bytes=budget, line_bytes=1000)
    for i in range(5):
        store.client.xadd("rw:log:r1", {"l": f"old {i}"})
    store.follow.append_log("r1", ["new"])
    assert [e.line for e in store.follow.read_log("r1")] == [f"old {i}" for i in range(5)] + ["new"]
    for i in range(200):
        store.follow.append_log("r1", [f"{i:03d} " + "x" * 500])
    lines = [e.line for e in store.follow.read_log("r1", count=1000)]
    assert not any(line.startswith("old") for line in lines)
    assert held(store, "r1", "log") == counted(store, "rw:log:r1") <= budget


def test_a_counter_that_is_gone_or_behind_never_moves_ids_back(store: RunStore) -> None:
    """The stream and its counter expire together, but not in the same instant."""
    store.follow.append_log("r1", ["a", "b"])
    store.client.delete(store.keys.stream_bytes("r1"))
    store.follow.append_log("r1", ["c"])
    store.client.delete("rw:log:r1")
    store.follow.append_log("r1", ["d"])  # the counter goes on alone
    store.client.hset(store.keys.stream_bytes("r2"), "log", 10**12)
    store.follow.append_log("r2", ["e", "f"])
    assert [e.line for e in store.follow.read_log("r1")] == ["d"]
    assert [e.line for e in store.follow.read_log("r2")] == ["e", "f"]
    assert held(store, "r2", "log") == counted(store, "rw:log:r2")
    assert store.follow.stream_bytes("r9") == (0, 0)


def test_the_store_refuses_bounds_that_cannot_hold_two_lines(
    make_store: Callable[..., RunStore],
) -> None:
    with pytest.raises(ValueError, match="two longest lines"):
        make_store(log_bytes=10_000, line_bytes=8000)
    with pytest.raises(ValueError, match="two longest lines"):
        make_store(line_bytes=10)


# --- retention --------------------------------------------------------------------


def ttl_ms(store: RunStore, key: str) -> int:
    value: Any = store.client.pttl(key)
    return int(value)


def test_an_ended_run_s_follow_data_expires_and_its_record_stays(
    make_store: Callable[..., RunStore],
) -> None:
    store = make_store(retention_s=1.5)
    running(store)
    store.follow.add("r1")
    assert store.follow.record_tail(
        "r1",
        lines=["step 1"],
        records=[{"event": "log", "step": 1, "loss": 0.5}],
        from_offsets=Offsets(0, 0),
        to_offsets=Offsets(7, 30),
    )
    store.stops.open("r1", SnapshotReason.REQUESTED, "test", T0, 60)
    data = store.keys.follow_data("r1")
    assert all(ttl_ms(store, key) == -1 for key in data)  # nothing expires while running

    end_run(store, "r1", RunState.STOPPED, snapshot=SNAP, note="ended")
    for key in data:
        assert 0 < ttl_ms(store, key) <= 1500, key
    kept = [store.keys.run("r1"), store.keys.runs, store.keys.stop_history("r1")]
    assert all(ttl_ms(store, key) == -1 for key in kept)

    # A follow tick that read before the end records late: its writes expire too.
    assert store.follow.record_tail(
        "r1", lines=["late"], records=[], from_offsets=Offsets(7, 30), to_offsets=Offsets(12, 30)
    )
    assert all(0 < ttl_ms(store, key) <= 1500 for key in data)

    wait_for(lambda: not any(store.client.exists(key) for key in data), timeout_s=10)
    assert store.follow.read_log("r1") == []
    assert store.follow.last_metrics("r1") is None
    assert store.runs.get("r1").state is RunState.STOPPED
    (closed,) = store.stops.history("r1")
    assert closed.note == "ended"


def test_a_run_without_follow_data_gets_none_made_to_last(
    make_store: Callable[..., RunStore],
) -> None:
    store = make_store(retention_s=3600)
    running(store)
    end_run(store, "r1", RunState.FAILED, message="x")
    offsets = store.keys.offsets("r1")
    assert 0 < ttl_ms(store, offsets) <= 3_600_000
    assert store.follow.offsets("r1") == Offsets(0, 0)
    # The first late write of a run that wrote nothing while it ran expires too.
    assert store.follow.record_tail(
        "r1", lines=["a"], records=[{"event": "log", "step": 1}], from_offsets=Offsets(0, 0),
        to_offsets=Offsets(2, 10),
    )  # fmt: skip
    for key in store.keys.follow_data("r1"):
        assert 0 < ttl_ms(store, key) <= 3_600_000, key


def test_the_default_retention_is_thirty_days(store: RunStore) -> None:
    running(store)
    store.follow.append_log("r1", ["a"])
    started = time.time()
    end_run(store, "r1", RunState.SUCCEEDED)
    left_s = ttl_ms(store, store.keys.log("r1")) / 1000
    assert 30 * 86400 - (time.time() - started) - 5 <= left_s <= 30 * 86400
