"""Bulk stops on the worker (`workers.bulk`) over a fakeredis store and real local
executors: the selection, the summary, every asked stop opened as a single stop opens
it (its proof deadline in the table, its countdown sent), one write per target, and
the producers a target allows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.harness.users import as_the_worker
from schemas import RunState, SnapshotReason, StopPhase
from schemas.errors import NotReplicated
from schemas.events import StopManyBody
from workers import bulk, stops
from workers.executors import LocalExecutor, ScriptExecutor
from workers.executors.transport import LocalTransport

from ...conftest import put_signed_target
from .conftest import policy_worker, running_run


def body(**fields: Any) -> StopManyBody:
    return StopManyBody.model_validate({"targets": ["local"], **fields})


def test_labels_and_a_name_glob_select_the_running_runs_and_each_gets_a_single_stops_timers(
    tmp_path: Path,
) -> None:
    worker, store, sent = policy_worker(tmp_path)
    now = datetime.now(UTC)
    running_run(store, tmp_path, "a1", name="gpt-a", labels={"sweep": "lr", "seed": "1"})
    running_run(store, tmp_path, "a2", name="gpt-b", labels={"sweep": "lr", "seed": "2"})
    running_run(store, tmp_path, "b1", name="bert-a", labels={"sweep": "lr"})
    running_run(store, tmp_path, "c1", name="gpt-c", labels={"sweep": "wd"})
    summary = bulk.stop_many(
        worker, body(labels={"sweep": "lr"}, name_glob="gpt-*", reason="cost"), "operator",
        "operator/cli", now,
    )  # fmt: skip
    assert sorted(summary.asked) == ["a1", "a2"]
    assert summary.already_stopping == summary.not_running == summary.refused == ()
    for run_id in ("a1", "a2"):
        assert (tmp_path / run_id / "snapshot.request").read_text() == "cost"
        stop = store.stops.get(run_id)
        assert stop is not None
        assert stop.phase is StopPhase.WAITING_PROOF
        assert stop.asked_by == "operator/cli"
        assert stop.reason is SnapshotReason.COST
        due = store.stops.due_deadlines(stop.proof_deadline, limit=10)
        assert (run_id, stop.stop_id, "proof") in [(d.run_id, d.stop_id, d.kind) for d in due]
    for run_id in ("b1", "c1"):
        assert not (tmp_path / run_id / "snapshot.request").exists()
        assert store.stops.get(run_id) is None
    countdowns = sent.named("runwarden.proof_timeout")
    assert sorted(c["run_id"] for c in countdowns) == ["a1", "a2"]
    assert [e.kind for e in store.ledger.events("a1")] == ["stop_opened"]


def test_the_summary_tells_already_stopping_not_running_and_refused(tmp_path: Path) -> None:
    worker, store, sent = policy_worker(tmp_path)
    now = datetime.now(UTC)
    running_run(store, tmp_path, "open1")
    stops.request_snapshot(worker, "open1", SnapshotReason.DISK, "policy:disk", now)
    running_run(store, tmp_path, "fresh1")
    running_run(store, tmp_path, "deaf1", snapshots=False)
    running_run(store, tmp_path, "ended1", state=RunState.STOPPED)
    running_run(store, tmp_path, "prep1", state=RunState.PREPARING, job=None)
    summary = bulk.stop_many(worker, body(all=True), "operator", "operator", now)
    assert summary.asked == ("fresh1",)
    assert summary.already_stopping == ("open1",)
    assert sorted(summary.not_running) == ["ended1", "prep1"]
    assert [r.run_id for r in summary.refused] == ["deaf1"]
    assert "snapshot" in summary.refused[0].why
    # As a single stop asked again: the open stop's reason is the new one, one countdown.
    again = store.stops.get("open1")
    assert again is not None
    assert again.reason is SnapshotReason.REQUESTED
    assert (tmp_path / "open1" / "snapshot.request").read_text() == "requested"
    assert [c["run_id"] for c in sent.named("runwarden.proof_timeout")] == ["open1", "fresh1"]


def test_a_producer_a_target_does_not_allow_gets_its_runs_refused_and_no_stop(
    tmp_path: Path,
) -> None:
    worker, store, sent = policy_worker(tmp_path)
    (tmp_path / "other").mkdir()
    config = {"name": "other", "kind": "local", "workdir": str(tmp_path / "other"),
              "producers": ["billing"], **as_the_worker()}  # fmt: skip
    put_signed_target(store, worker.settings, config)
    running_run(store, tmp_path, "mine", target="other")
    running_run(store, tmp_path, "theirs")
    local = {"name": "local", "kind": "local", "workdir": str(tmp_path),
             "producers": ["ops"], **as_the_worker()}  # fmt: skip
    put_signed_target(store, worker.settings, local)
    request = StopManyBody(targets=("other", "local"), all=True)
    summary = bulk.stop_many(worker, request, "billing", "billing", datetime.now(UTC))
    assert summary.asked == ("mine",)
    assert [(r.run_id, r.why) for r in summary.refused] == [
        ("theirs", "producer 'billing' may not act on target 'local'")
    ]
    assert store.stops.get("theirs") is None
    assert not (tmp_path / "theirs" / "snapshot.request").exists()
    assert len(sent.named("runwarden.proof_timeout")) == 1


def test_one_batched_write_per_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    worker, store, _ = policy_worker(tmp_path)
    for i in range(30):
        running_run(store, tmp_path, f"r{i:02d}")
    calls: list[int] = []
    real = LocalExecutor.put_files

    def counted(self: LocalExecutor, files: list[tuple[str, str]]) -> list[str | None]:
        calls.append(len(files))
        return real(self, files)

    monkeypatch.setattr(LocalExecutor, "put_files", counted)
    summary = bulk.stop_many(worker, body(all=True), "operator", "operator", datetime.now(UTC))
    assert len(summary.asked) == 30
    assert calls == [30]


def test_the_put_files_script_writes_each_file_and_says_which_failed(tmp_path: Path) -> None:
    executor = ScriptExecutor(LocalTransport(), str(tmp_path))
    (tmp_path / "a").mkdir()
    (tmp_path / "blocked").write_text("a file where a directory should be")
    (tmp_path / "c" / "snapshot.request").mkdir(parents=True)  # a job's directory in its place
    files = [
        (str(tmp_path / "a" / "snapshot.request"), "cost"),
        (str(tmp_path / "blocked" / "snapshot.request"), "cost"),
        (str(tmp_path / "c" / "snapshot.request"), 'it\'s "quoted" $(touch PWNED)'),
        (str(tmp_path / "new dir" / "snapshot.request"), "deadline"),
    ]
    answers = executor.put_files(files)
    assert answers[0] is None
    assert answers[2] is None
    assert answers[3] is None
    assert answers[1] is not None
    assert "blocked" in answers[1]
    assert (tmp_path / "a" / "snapshot.request").read_text() == "cost"
    assert (tmp_path / "c" / "snapshot.request").read_text() == files[2][1]
    assert (tmp_path / "new dir" / "snapshot.request").read_text() == "deadline"
    assert not list(tmp_path.rglob("PWNED"))
    assert not list(tmp_path.rglob("*.rw-tmp.*"))


def test_put_files_of_more_than_one_script_holds_are_cut_in_batches(tmp_path: Path) -> None:
    executor = ScriptExecutor(LocalTransport(), str(tmp_path))
    long = "d" * 200
    files = [(str(tmp_path / long / f"{i:04d}" / "snapshot.request"), "cost") for i in range(700)]
    assert executor.put_files(files) == [None] * 700
    assert len(list((tmp_path / long).glob("*/snapshot.request"))) == 700


def test_a_stop_no_replica_confirmed_is_refused_and_its_job_asked_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a single stop (`stops.request_snapshot`): a stop opened on the primary but
    confirmed by no replica is reported refused, and its request is written anyway,
    so a stop that survives a failover never cancels a job that was not asked."""
    worker, store, _ = policy_worker(tmp_path)
    running_run(store, tmp_path, "a1")
    running_run(store, tmp_path, "a2")
    opening = stops._open

    def unconfirmed_a2(ctx: Any, run: Any, *args: Any, **kwargs: Any) -> Any:
        opened = opening(ctx, run, *args, **kwargs)
        if run.id == "a2":
            raise NotReplicated("0 of 1 replica acknowledged the write within 0.05 s")
        return opened

    monkeypatch.setattr(stops, "_open", unconfirmed_a2)
    summary = bulk.stop_many(worker, body(all=True), "operator", "operator/cli",
                             datetime.now(UTC))  # fmt: skip
    assert summary.asked == ("a1",)
    assert [r.run_id for r in summary.refused] == ["a2"]
    for run_id in ("a1", "a2"):
        assert (tmp_path / run_id / "snapshot.request").read_text() == "requested"
