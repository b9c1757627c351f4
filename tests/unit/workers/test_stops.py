"""`workers.stops`: requests for a snapshot (a policy's keeps the first reason of an
open stop and never writes over a request already in the run directory) and
requests noticed by a watch tick."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import fakeredis

from schemas import JobId, RunLimits, RunRecord, RunState, Settings, SnapshotReason
from store import RunStore
from workers import stops
from workers.context import Context

from .conftest import policy_worker, running_run


def test_a_policy_request_keeps_the_first_reason_of_an_open_stop(tmp_path: Path) -> None:
    worker, store, sent = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r2", limits=RunLimits(max_hours=0.5))
    stops.request_snapshot(worker, "r2", SnapshotReason.DISK, "policy:disk", datetime.now(UTC),
                            only_if_none_open=True)  # fmt: skip
    again = stops.request_snapshot(worker, "r2", SnapshotReason.DEADLINE, "policy:deadline",
                                    datetime.now(UTC), only_if_none_open=True)  # fmt: skip
    assert again.reason is SnapshotReason.DISK
    assert (Path(run.remote_dir) / "snapshot.request").read_text() == "disk"
    assert len(sent.named("runwarden.proof_timeout")) == 1  # one stop, one countdown


def test_a_policy_never_writes_over_a_request_already_in_the_run_directory(
    tmp_path: Path,
) -> None:
    worker, store, sent = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r3", limits=RunLimits(max_hours=0.5))
    request = Path(run.remote_dir) / "snapshot.request"
    request.write_text("deadline\n")  # the watchdog's, not seen by a tick yet
    stop = stops.request_snapshot(
        worker, "r3", SnapshotReason.DISK, "policy:disk", datetime.now(UTC), only_if_none_open=True
    )
    assert stop.reason is SnapshotReason.DEADLINE
    assert stop.asked_by == "watch"
    assert request.read_text() == "deadline\n"
    assert len(sent.named("runwarden.proof_timeout")) == 1


# A watch tick works from the runs it read at its start: a request it finds must not open a stop for
# a run that ended meanwhile (finished by another worker).
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
