"""A watch tick works from the runs it read at its start: a request it finds must not
open a stop for a run that ended meanwhile (finished by another worker)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import fakeredis

from schemas import JobId, RunRecord, RunState, Settings
from store import RunStore
from workers import stops
from workers.context import Context


def test_a_request_seen_by_a_stale_tick_opens_no_stop_for_an_ended_run(tmp_path: Path) -> None:
    store = RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    store.put_target("local", {"kind": "local", "workdir": str(tmp_path)})
    now = datetime.now(UTC)
    run = RunRecord(
        id="r1",
        target="local",
        created=now,
        remote_dir=str(tmp_path / "r1"),
        job=JobId(dir=str(tmp_path / "r1"), pid=12345),
        state=RunState.RUNNING,
        command="true",
    )
    assert store.create_run(run)
    scheduled: list[tuple[str, object, float]] = []
    worker = Context(store, Settings(), lambda n, k, c: scheduled.append((n, k, c)), "w")

    stale = store.get_run("r1")  # what a watch tick read at its start
    store.transition("r1", RunState.CANCELLED)  # another worker recorded the end meanwhile
    stops.notice_request(worker, stale, "requested", now)  # the tick saw snapshot.request

    assert store.get_stop("r1") is None
    assert store.stop_history("r1") == []
    assert scheduled == []
