"""`workers.stops`: requests for a snapshot (a policy's keeps the first reason of an
open stop and never writes over a request already in the run directory) and
requests noticed by a watch tick."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fakeredis
import pytest

from bench.harness.webhook_receiver import Receiver, receiver
from schemas import (
    JobId,
    JobStatus,
    RunLimits,
    RunRecord,
    RunState,
    Settings,
    SnapshotReason,
    StopPhase,
)
from schemas.errors import NotReplicated
from schemas.ledger import CancelFailed
from schemas.metrics import SCRIPT_TIMEOUTS
from store import RunStore
from workers import cancel_mark, cancels, reconcile, stops
from workers.context import Context
from workers.executors import CommandError, shell

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
    store.targets.put("local", {"kind": "local", "workdir": str(tmp_path)})
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
    assert store.runs.create(run)
    scheduled: list[tuple[str, object, float]] = []
    worker = Context(store, Settings(), lambda n, k, c: scheduled.append((n, k, c)), "w")

    stale = store.runs.get("r1")  # what a watch tick read at its start
    store.runs.transition("r1", RunState.CANCELLED)  # another worker recorded the end meanwhile
    stops.notice_request(worker, stale, "requested", now)  # the tick saw snapshot.request

    assert store.stops.get("r1") is None
    assert store.stops.history("r1") == []
    assert scheduled == []


# --- a cancel's deadline ------------------------------------------------------------


@pytest.fixture
def alerts() -> Iterator[Receiver]:
    """A webhook receiver on loopback."""
    with receiver() as got:
        yield got


def test_a_cancel_past_its_deadline_holds_no_process_and_is_left_to_reconcile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alerts: Receiver
) -> None:
    """A job deaf to its first SIGTERM keeps the cancel's script waiting: the script is
    cut at its deadline (1 s here, 20 s in service), the producer gets the error, the
    failure is told to a webhook that wants `cancel_failed` (a real receiver on
    loopback), and the run's stop waits in `cancelling` for `reconcile`, whose retry
    ends the job."""
    hooks = [{"name": "ops", "url": alerts.url + "/alerts", "events": ["cancel_failed"]}]
    worker, store, sent = policy_worker(tmp_path, webhooks=json.dumps(hooks))
    worker.settings.secrets.ensure("webhook.ops.secret", "s3cret")
    run_dir = tmp_path / "r1"
    # The first SIGTERM is swallowed (the trap then resets itself), the second ends it.
    job = subprocess.Popen(
        ["sh", "-c", "trap 'trap - TERM' TERM; while :; do sleep 0.05; done"],
        start_new_session=True,
    )
    try:
        running_run(store, tmp_path, "r1", job=JobId(dir=str(run_dir), pid=job.pid))
        monkeypatch.setattr(shell, "CANCEL_DEADLINE_S", 1.0)
        started = time.monotonic()
        with pytest.raises(CommandError, match="timed out after 1 s"):
            cancels.cancel(worker, "r1", asked_by="operator/cli")
        assert time.monotonic() - started < 4.0  # the deadline, not the script's 10 s wait
        # Killed and counted, by target and action.
        counted = [s for s in store.counters.series() if s.spec is SCRIPT_TIMEOUTS]
        assert [(s.labels, s.value) for s in counted] == [(("local", "cancel"), 1.0)]
        assert job.poll() is None  # alive: the cut cancel is not the end of it
        assert store.runs.get("r1").state is RunState.RUNNING
        assert not cancel_mark.cancelling_now(worker, "r1")  # the next cancel may signal it

        stop = store.stops.get("r1")
        assert stop is not None
        assert (stop.phase, stop.cancels, stop.asked_by) == (
            StopPhase.CANCELLING, 1, "operator/cli"
        )  # fmt: skip
        assert stop.end_deadline is not None
        retry_s = (stop.end_deadline - stop.asked_at).total_seconds()
        assert retry_s == pytest.approx(cancel_mark.CANCEL_RETRY_S, abs=1.0)
        pending = store.stops.pending_deadlines()
        assert [(d.stop_id, d.kind) for d in pending] == [(stop.stop_id, "end")]
        assert "the cancel failed" in (stop.note or "")
        (alert,) = alerts.wait_for(1, timeout_s=10, path="/alerts")
        assert alert.headers["x-runwarden-event"] == "cancel_failed"
        assert alert.signature_ok(b"s3cret")
        told = alert.json()
        assert (told["run_id"], told["stop_id"], told["attempt"]) == ("r1", stop.stop_id, 1)
        assert "timed out after 1 s" in told["error"]
        assert told["retry_in_s"] == pytest.approx(cancel_mark.CANCEL_RETRY_S)
        (failed,) = [e for e in store.ledger.events("r1") if e.kind == "cancel_failed"]
        assert failed.describe().startswith("cancel failed (attempt 1): ")

        # Reconcile fires the retry deadline when it comes: that cancel ends the job.
        monkeypatch.undo()
        later = stop.end_deadline + timedelta(seconds=1)
        assert reconcile.reconcile(worker, later) == 1
        assert sent.calls[-1][0] == "runwarden.end_timeout"
        assert cancels.on_deadline(worker, "r1", stop.stop_id, later) == "cancelled"
        assert store.runs.get("r1").state is RunState.CANCELLED
        assert store.stops.get("r1") is None
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_a_cancel_waits_for_another_tasks_cancel_no_longer_than_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, store, _ = policy_worker(tmp_path)
    running_run(store, tmp_path, "r1")
    assert store.locks.once(cancel_mark.cancel_key("r1"), ttl_s=60)  # another task is cancelling it
    monkeypatch.setattr(cancels, "CANCEL_DEADLINE_S", 0.5)
    started = time.monotonic()
    record = cancels.cancel(worker, "r1", asked_by="operator/cli")
    assert 0.5 <= time.monotonic() - started < 2.0
    assert record.state is RunState.RUNNING  # that cancel goes on; this task returns


def test_a_deadline_s_cancel_that_fails_is_told_each_time_with_its_doubling_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proof deadline passes and the cancel fails (the target cannot be reached): the
    decision and the failure are in the ledger (`cancel_failed`: the attempt, the
    error, the retry); the retry deadline's cancel fails again: attempt 2, twice the
    wait."""
    worker, store, _ = policy_worker(tmp_path)
    job = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=job.pid))
        _fails_twice(worker, store, monkeypatch)
    finally:
        job.kill()
        job.wait()


def _fails_twice(worker: Context, store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC)
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "operator/cli", now, 30.0)

    def unreachable(self: object, job: JobId) -> None:
        raise CommandError("cancel", "connection refused")

    monkeypatch.setattr(type(worker.executor("local")), "cancel", unreachable)
    first = now + timedelta(seconds=31)
    assert cancels.on_deadline(worker, "r1", stop.stop_id, first) == "cancel failed"
    retry = store.stops.get("r1")
    assert retry is not None
    assert retry.end_deadline is not None
    second = retry.end_deadline + timedelta(seconds=1)
    assert cancels.on_deadline(worker, "r1", stop.stop_id, second) == "cancel failed"
    told = [e for e in store.ledger.events("r1") if e.kind in ("cancel_decided", "cancel_failed")]
    assert [(e.kind, getattr(e, "attempt", None)) for e in told] == [
        ("cancel_decided", 1), ("cancel_failed", 1), ("cancel_decided", 2), ("cancel_failed", 2)
    ]  # fmt: skip
    failed = [e for e in told if isinstance(e, CancelFailed)]
    assert [e.retry_in_s for e in failed] == [
        cancel_mark.CANCEL_RETRY_S, 2 * cancel_mark.CANCEL_RETRY_S
    ]  # fmt: skip
    assert all("connection refused" in e.error and e.stop_id == stop.stop_id for e in failed)
    assert store.runs.get("r1").state is RunState.RUNNING


def test_a_deadline_whose_move_no_replica_confirmed_cancels_the_job_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover under way: the stop's move to `cancelling` is on the primary but no
    replica confirmed it (`NotReplicated`). The deadline has come all the same: the job
    is cancelled now, not at the retry deadline (a full run saw a hung job wait past
    its test's 40 s for that retry)."""
    worker, store, _ = policy_worker(tmp_path)
    running_run(store, tmp_path, "r1")
    now = datetime.now(UTC)
    stop = stops.request_snapshot(worker, "r1", SnapshotReason.REQUESTED, "cli", now)
    advance = store.stops.advance

    def unconfirmed(*args: object, **kwargs: object) -> object:
        advance(*args, **kwargs)
        raise NotReplicated("0 of 1 replica acknowledged the write within 1 s")

    monkeypatch.setattr(store.stops, "advance", unconfirmed)
    cancelled: list[str] = []
    monkeypatch.setattr(
        cancels, "_cancel_once", lambda ctx, run, job: cancelled.append(run.id) or run
    )
    assert cancels._escalate(worker, stop, "no proof", now) == "cancelling"
    assert cancelled == ["r1"]
    moved = store.stops.get("r1")
    assert moved is not None
    assert (moved.phase, moved.cancels) == (StopPhase.CANCELLING, 1)


@pytest.mark.parametrize("running_reads", [3, 1000])
def test_a_job_told_running_after_its_cancel_answered_is_read_again_never_ended_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running_reads: int
) -> None:
    """The cancel's script answered, yet the status still says running (a group's last
    member a zombie its parent has not reaped yet): the status is read again for up to
    `SETTLE_S`; told ended within it, the run ends as it says; still running
    then, the cancel counts as failed (`cancel_failed`, retried) and the run stays
    running, never a task that raises."""
    worker, store, _ = policy_worker(tmp_path)
    running_run(store, tmp_path, "r1")
    monkeypatch.setattr(cancels, "SETTLE_S", 0.5)
    executor = type(worker.executor("local"))
    reads: list[JobId] = []

    def status(self: object, job: JobId) -> JobStatus:
        reads.append(job)
        return JobStatus.RUNNING if len(reads) <= running_reads else JobStatus.CANCELLED

    monkeypatch.setattr(executor, "cancel", lambda self, job: None)
    monkeypatch.setattr(executor, "status", status)
    now = datetime.now(UTC)
    stop, _ = store.stops.open("r1", SnapshotReason.REQUESTED, "operator/cli", now, 30.0)
    done = cancels.on_deadline(worker, "r1", stop.stop_id, now + timedelta(seconds=31))
    if running_reads == 3:
        assert done == "cancelled"
        # The deadline's own read (running), then the cancel's: twice running, then ended.
        assert len(reads) == running_reads + 1
        assert store.runs.get("r1").state is RunState.CANCELLED
        return
    assert done == "cancel failed"
    assert store.runs.get("r1").state is RunState.RUNNING
    (failed,) = [e for e in store.ledger.events("r1") if isinstance(e, CancelFailed)]
    assert "the job still runs 0.5 s after its cancel" in failed.error
    assert not cancel_mark.cancelling_now(worker, "r1")  # the retry may signal it
