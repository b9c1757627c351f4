"""`workers.policies`: the policy tick publishes snapshot requests as any producer,
at most once a period, and probes a target's disk at most once a period."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas import RunLimits, RunRecord, RunState, SnapshotReason
from schemas.events import TASK_SNAPSHOT_REQUEST, SnapshotRequestBody
from schemas.policy import DiskSample
from workers import policies
from workers.executors import ProtocolError

from .conftest import policy_worker, running_run


def test_the_policy_tick_publishes_one_request_per_run_as_a_producer(tmp_path: Path) -> None:
    worker, store, sent = policy_worker(tmp_path)
    running_run(store, tmp_path, "late", limits=RunLimits(max_hours=1.1, disk=False))
    running_run(store, tmp_path, "costly",
                limits=RunLimits(max_cost_usd=10, usd_per_hour=10, disk=False))  # fmt: skip
    running_run(store, tmp_path, "fine", limits=RunLimits(max_hours=100, disk=False))
    result = policies.policy_target(worker, "local", datetime.now(UTC))
    assert result == {"runs": 3, "asked": 2}
    published = sent.named(TASK_SNAPSHOT_REQUEST)
    bodies = {b["run_id"]: SnapshotRequestBody.model_validate(b) for b in published}
    assert set(bodies) == {"late", "costly"}
    assert bodies["late"].reason is SnapshotReason.DEADLINE
    assert bodies["costly"].reason is SnapshotReason.COST
    assert all(b.only_if_none_open for b in bodies.values())
    assert bodies["costly"].asked_by == "policy:cost"
    # The next tick within the policy period publishes nothing more.
    policies.policy_target(worker, "local", datetime.now(UTC))
    assert len(sent.named(TASK_SNAPSHOT_REQUEST)) == 2


def test_a_run_with_an_open_stop_is_never_asked_by_a_policy(tmp_path: Path) -> None:
    worker, store, sent = policy_worker(tmp_path)
    running_run(store, tmp_path, "asked", limits=RunLimits(max_hours=0.5, disk=False))
    store.stops.open("asked", SnapshotReason.REQUESTED, "cli", datetime.now(UTC), 60)
    policies.policy_target(worker, "local", datetime.now(UTC))
    assert sent.named(TASK_SNAPSHOT_REQUEST) == []


def test_a_run_that_ends_during_the_tick_is_never_asked_after_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy's stop is open, the run proves and ends while a tick reads: its end
    (the stop closed with it, in one transaction) lands between the tick's reads of
    the records and of the stops. The tick neither tells a decision nor asks a
    snapshot for it (a full run's ledger showed `policy_decision` after `run_ended`)."""
    worker, store, sent = policy_worker(tmp_path)
    running_run(store, tmp_path, "costly",
                limits=RunLimits(max_cost_usd=10, usd_per_hour=10, disk=False))  # fmt: skip
    stop, _ = store.stops.open("costly", SnapshotReason.COST, "policy:cost", datetime.now(UTC), 60)
    read = worker.records

    def records_then_the_end(run_ids: list[str]) -> list[RunRecord | None]:
        found = read(run_ids)  # read while it runs
        store.runs.transition("costly", RunState.STOPPED)
        store.stops.close("costly", stop.stop_id, note="the run ended stopped")
        return found

    monkeypatch.setattr(worker, "records", records_then_the_end)
    assert policies.policy_target(worker, "local", datetime.now(UTC))["asked"] == 0
    assert sent.named(TASK_SNAPSHOT_REQUEST) == []
    assert [e.kind for e in store.ledger.events("costly")] == []


def test_the_disk_policy_probes_a_target_at_most_once_a_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, store, sent = policy_worker(tmp_path, disk_used_fraction=0.000001)
    running_run(store, tmp_path, "d1")
    probes: list[Sequence[str]] = []
    executor = worker.executor("local")
    real = executor.disk_usage

    def counting(run_dirs: Sequence[str]) -> list[DiskSample | ProtocolError]:
        probes.append(run_dirs)
        return real(run_dirs)

    monkeypatch.setattr(executor, "disk_usage", counting)
    policies.policy_target(worker, "local", datetime.now(UTC))
    policies.policy_target(worker, "local", datetime.now(UTC))
    assert len(probes) == 1
    (body,) = sent.named(TASK_SNAPSHOT_REQUEST)
    assert body["reason"] == "disk"
    assert body["asked_by"] == "policy:disk"
