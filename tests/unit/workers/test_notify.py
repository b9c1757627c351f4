"""`workers.notify`: the event seam the run operations call: a stop, its proof at the
run's end, the run's end and its retrieval told in order in the ledger, with the
checkpoint's digest; webhooks queued from the configuration; an event that cannot be
recorded never breaks the stop."""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from schemas import JobStatus, RunState, SnapshotReason, StoreError
from schemas.ledger import (
    JobCancelled,
    LedgerEvent,
    ProofSeen,
    RetrievalDone,
    RunEnded,
    StopOpened,
)
from workers import finish, notify, stops
from workers.artifacts import retrieve_artifacts
from workers.webhooks import WebhookDelivery

from .conftest import ended_run, policy_worker, running_run

HOOKS = json.dumps([
    {"name": "ops", "url": "http://127.0.0.1:9/in", "secret_env": "OPS_SECRET",
     "events": ["stop_opened", "run_ended"]},
    {"name": "chat", "url": "http://127.0.0.1:9/chat", "format": "slack"},
])  # fmt: skip


@pytest.fixture(autouse=True)
def no_thread(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The seam's delivery thread is `workers.webhooks`' own test: here it is noted only."""
    started: list[Any] = []

    def noted(delivery: WebhookDelivery) -> bool:
        started.append(delivery)
        return True

    monkeypatch.setattr(WebhookDelivery, "start", noted)
    return started


def kinds(events: list[LedgerEvent]) -> list[str]:
    return [e.kind for e in events]


def test_a_stop_proved_at_the_end_is_told_in_order_with_its_digest(tmp_path: Path) -> None:
    worker, store, _ = policy_worker(tmp_path, artifact_dir=tmp_path / "artifacts")
    run = ended_run(store, tmp_path)  # running; its job left a proof of step 3
    stop = stops.request_snapshot(worker, run.id, SnapshotReason.REQUESTED, "cli",
                                  datetime.now(UTC))  # fmt: skip
    finish.finish(worker, run, JobStatus.CANCELLED, worker.executor("local"))
    retrieve_artifacts(worker, run.id, datetime.now(UTC))
    ledger = store.ledger.events(run.id)
    assert kinds(ledger) == ["stop_opened", "proof_seen", "run_ended", "retrieval_done"]
    opened, proof, ended, retrieved = ledger
    assert isinstance(opened, StopOpened)
    assert (opened.stop_id, opened.asked_by, opened.reason) == (stop.stop_id, "cli", "requested")
    assert opened.proof_deadline == stop.proof_deadline
    assert isinstance(proof, ProofSeen)
    assert (proof.stop_id, proof.step, proof.checkpoint) == (stop.stop_id, 3, "output/checkpoint-3")
    assert proof.due is None  # seen at the run's end, not at its deadline
    assert proof.seen_by == "end"
    assert proof.asked_at == stop.asked_at
    assert isinstance(ended, RunEnded)
    assert (ended.stop_id, ended.state) == (stop.stop_id, RunState.STOPPED)
    # The proof says it was written at 1.0 (1970): never before it was asked.
    assert proof.at == stop.asked_at
    assert proof.seen_at is not None
    assert stop.asked_at <= proof.seen_at <= ended.at
    assert isinstance(retrieved, RetrievalDone)
    assert retrieved.stop_id == stop.stop_id
    # The digest, computed here from the stored manifest.json as documented.
    manifest = json.loads((tmp_path / "artifacts" / run.id / "manifest.json").read_text())
    lines = sorted(
        f"{f['path']} {f['sha256']}\n"
        for f in manifest["files"]
        if f["path"].startswith("output/checkpoint-3/")
    )
    assert len(lines) == 1
    assert retrieved.checkpoint_digest == hashlib.sha256("".join(lines).encode()).hexdigest()
    assert retrieved.bytes == sum(f["size"] for f in manifest["files"])


def test_webhooks_get_the_events_they_want_in_their_format(
    tmp_path: Path, no_thread: list[Any]
) -> None:
    worker, store, _ = policy_worker(tmp_path, webhooks=HOOKS)
    run = running_run(store, tmp_path, "r1")
    stop = stops.request_snapshot(worker, run.id, SnapshotReason.DISK, "<!channel> & co",
                                  datetime.now(UTC))  # fmt: skip
    assert no_thread  # woken
    due = sorted(store.webhooks.due(datetime.now(UTC)))
    assert due == ["chat|r1", "ops|r1"]
    ops_head = store.webhooks.head("ops|r1")
    assert ops_head is not None
    delivery = json.loads(ops_head[0])
    assert (delivery["kind"], delivery["run_id"]) == ("stop_opened", "r1")
    body = json.loads(delivery["body"])
    assert (body["stop_id"], body["asked_by"], body["id"]) == (stop.stop_id, "<!channel> & co",
                                                              delivery["id"])  # fmt: skip
    chat_head = store.webhooks.head("chat|r1")
    assert chat_head is not None
    text = json.loads(json.loads(chat_head[0])["body"])["text"]
    escaped = "stop opened (disk, asked by &lt;!channel&gt; &amp; co)"
    assert text.startswith(f"runwarden: run r1: {escaped}")
    assert "<" not in text


def test_an_event_that_cannot_be_recorded_never_breaks_the_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, store, sent = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r1")

    def broken(*_: object, **__: object) -> None:
        raise StoreError("run store: cannot reach Redis (record_event): down")

    monkeypatch.setattr(store.ledger, "record", broken)
    with caplog.at_level(logging.ERROR, logger="runwarden"):
        stop = stops.request_snapshot(worker, run.id, SnapshotReason.REQUESTED, "cli",
                                      datetime.now(UTC))  # fmt: skip
    assert store.stops.get(run.id) == stop
    assert sent.named("runwarden.proof_timeout")
    assert "the ledger could not record an event (StopOpened.of)" in caplog.text


def test_a_builder_that_fails_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker, store, _ = policy_worker(tmp_path)

    def bad() -> LedgerEvent:
        raise ValueError("no")

    with caplog.at_level(logging.ERROR, logger="runwarden"):
        notify.emit(worker, bad)
        notify.emit(worker, lambda: None)
    assert "could not record" in caplog.text
    assert store.ledger.history() == []


def test_a_follow_tick_is_timed_per_target(tmp_path: Path) -> None:
    worker, store, _ = policy_worker(tmp_path)
    notify.observe_tick(worker, "local", 0.2)
    (series,) = store.counters.series()
    assert (series.spec.name, series.labels, series.count, series.sum) == (
        "runwarden_follow_tick_seconds", ("local",), 1.0, 0.2,
    )  # fmt: skip


def test_a_job_cancelled_after_its_run_s_end_belongs_to_the_stop_it_ended(
    tmp_path: Path,
) -> None:
    worker, store, _ = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r1")
    stop = stops.request_snapshot(worker, run.id, SnapshotReason.REQUESTED, "cli",
                                  datetime.now(UTC))  # fmt: skip
    ended = store.runs.transition(run.id, RunState.CANCELLED)
    notify.emit(worker, RunEnded.of, ended, datetime.now(UTC))  # a follow tick saw it first
    notify.emit(worker, JobCancelled.of, run.id, datetime.now(UTC))  # then the cancel returns
    assert kinds(store.ledger.events(run.id)) == ["stop_opened", "run_ended", "job_cancelled"]
    assert [e.stop_id for e in store.ledger.events(run.id)] == [stop.stop_id] * 3
    # A run without a stop: nothing to belong to.
    other = running_run(store, tmp_path, "r2")
    notify.emit(worker, JobCancelled.of, other.id, datetime.now(UTC))
    assert [e.stop_id for e in store.ledger.events(other.id)] == [None]
