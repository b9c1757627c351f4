"""The stop ledger end to end, with real redis-server, Celery worker and beat, real
jobs and shortened clocks (bench/harness/pipeline.py): four runs stopped four ways at once:
by the CLI (proof, then the end), by the API with a job that ignores the request
(cancelled at the proof deadline), by the API with a job that proves and hangs (its
proof seen by the follow, the end deadline from the proof cancels it), and by the
cost policy, and a fifth cancelled by a person; each run's ledger tells who asked,
the timers, what came of it, and the checkpoint's digest once it is home; `runwarden
stops --history` and `show --json` show it."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bench.harness.pipeline import CLOCKS, Pipeline, running_pipeline, toy
from schemas import ArtifactsPhase, RunLimits, RunRecord, RunState, SnapshotReason
from schemas.events import LaunchSpec
from schemas.ledger import (
    CancelDecided,
    LedgerEvent,
    PolicyDecision,
    ProofSeen,
    RetrievalDone,
    RunEnded,
    StopOpened,
)

from .test_cli import ok, refused, run_cli

pytestmark = pytest.mark.slow

PROOF_S = float(CLOCKS["RUNWARDEN_PROOF_TIMEOUT_S"])
END_S = float(CLOCKS["RUNWARDEN_END_TIMEOUT_S"])
TICK_S = float(CLOCKS["RUNWARDEN_FOLLOW_POLL_S"])
ON_TIME_S = float(CLOCKS["RUNWARDEN_RECONCILE_S"]) + 3.0
"""How late a deadline may be acted on here: the countdown fires it, reconcile (every
second) if the countdown is late; the rest is this shared machine's noise."""


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


def launch(pipeline: Pipeline, *args: str, limits: RunLimits | None = None) -> RunRecord:
    spec = LaunchSpec(
        target="local",
        command=toy("--steps", "100000", "--step-time", "0.05", *args),
        limits=limits or RunLimits(disk=False),
    )
    return pipeline.api.launch(spec, wait_s=60)


def ledger_when(
    pipeline: Pipeline, run_id: str, last: str, timeout_s: float = 60
) -> list[LedgerEvent]:
    """The run's ledger once an event of kind `last` is in it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = pipeline.api.ledger(run_id)
        if any(e.kind == last for e in events):
            return events
        time.sleep(0.2)
    raise AssertionError(f"no {last} in the ledger of {run_id}: {pipeline.api.ledger(run_id)}\n"
                         + pipeline.logs())  # fmt: skip


def digest_of(run: RunRecord) -> str:
    """The checkpoint's digest, computed here from the stored manifest.json."""
    assert run.artifacts is not None
    assert run.artifacts.phase is ArtifactsPhase.DONE
    assert run.artifacts.path is not None
    assert run.snapshot is not None
    manifest = json.loads((Path(run.artifacts.path) / "manifest.json").read_text())
    prefix = run.snapshot.checkpoint + "/"
    lines = sorted(f"{f['path']} {f['sha256']}\n" for f in manifest["files"]
                   if f["path"].startswith(prefix))  # fmt: skip
    assert lines
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def kinds(events: list[LedgerEvent]) -> list[str]:
    return [e.kind for e in events]


def test_each_stop_s_story_is_in_the_ledger(pipeline: Pipeline) -> None:
    api = pipeline.api
    proving = launch(pipeline)
    ignoring = launch(pipeline, "--ignore-requests")
    hanging = launch(pipeline, "--hang-after-proof")
    # 1 USD at 600 USD/h: the cost policy asks after about 5.7 s.
    costly = launch(pipeline, limits=RunLimits(max_cost_usd=1, usd_per_hour=600, disk=False))
    cancelled = launch(pipeline)
    for run in (proving, ignoring, hanging, cancelled):
        pipeline.wait_step(run.id, 3)
    api.cancel(cancelled.id)
    ok(run_cli(pipeline.env, "stop", proving.id))
    ignored_stop = api.stop(ignoring.id)
    hung_stop = api.stop(hanging.id, SnapshotReason.REQUESTED, asked_by="svc-trainer-ops")

    # 1. Asked by the CLI; the job proves and ends: its proof is seen at the end.
    events = ledger_when(pipeline, proving.id, "retrieval_done")
    assert kinds(events) == ["stop_opened", "proof_seen", "run_ended", "retrieval_done"]
    opened, proof, ended, home = events
    assert isinstance(opened, StopOpened)
    # Who asked: the producer the message was signed by (the CLI's: `operator`), and
    # what it said after it.
    assert (opened.asked_by, opened.reason) == ("operator/cli", "requested")
    assert opened.proof_deadline == opened.at + timedelta(seconds=PROOF_S)
    assert isinstance(proof, ProofSeen)
    assert (proof.due, proof.asked_at, proof.stop_id) == (None, opened.at, opened.stop_id)
    assert isinstance(ended, RunEnded)
    assert (ended.state, ended.stop_id) == (RunState.STOPPED, opened.stop_id)
    assert ended.snapshot is not None
    assert (proof.step, proof.checkpoint) == (ended.snapshot.step, ended.snapshot.checkpoint)
    assert opened.at < proof.at < opened.proof_deadline
    assert isinstance(home, RetrievalDone)
    assert home.stop_id == opened.stop_id
    assert home.checkpoint_digest == digest_of(api.get_run(proving.id))

    # 2. Asked by the API; the job ignores it: cancelled at the proof deadline, on time.
    events = ledger_when(pipeline, ignoring.id, "retrieval_done")
    events = ledger_when(pipeline, ignoring.id, "job_cancelled")
    assert sorted(kinds(events)) == sorted(["stop_opened", "cancel_decided", "job_cancelled",
                                            "run_ended", "retrieval_done"])  # fmt: skip
    # The job's end is seen by the cancel or by a follow tick, whichever is first; the
    # cancel is told when it returns (its group gone), maybe after the retrieval.
    assert kinds(events)[:2] == ["stop_opened", "cancel_decided"]
    assert [k for k in kinds(events) if k != "job_cancelled"][2:] == ["run_ended",
                                                                       "retrieval_done"]
    opened, cancel = events[0], events[1]
    assert isinstance(opened, StopOpened)
    assert (opened.asked_by, opened.stop_id) == ("operator", ignored_stop.stop_id)
    assert isinstance(cancel, CancelDecided)
    assert (cancel.cause, cancel.due, cancel.attempt) == ("proof_timeout", opened.proof_deadline, 1)
    assert timedelta(0) <= cancel.at - opened.proof_deadline < timedelta(seconds=ON_TIME_S)
    (ended,) = [e for e in events if isinstance(e, RunEnded)]
    assert (ended.state, ended.stop_id) == (RunState.CANCELLED, opened.stop_id)
    assert all(e.stop_id == opened.stop_id for e in events)

    # 3. The job proves and hangs: proof seen by the follow, written at its own time;
    # cancelled at the end deadline, counted from the proof.
    events = ledger_when(pipeline, hanging.id, "retrieval_done")
    assert kinds(events)[:3] == ["stop_opened", "proof_seen", "cancel_decided"]
    opened, proof, cancel = events[:3]
    assert isinstance(opened, StopOpened)
    assert (opened.asked_by, opened.stop_id) == ("operator/svc-trainer-ops", hung_stop.stop_id)
    assert isinstance(proof, ProofSeen)
    assert (proof.due, proof.seen_by) == (None, "follow")
    assert proof.seen_at is not None
    assert opened.at <= proof.at <= proof.seen_at < opened.proof_deadline
    assert proof.seen_at - proof.at < timedelta(seconds=TICK_S + ON_TIME_S)
    assert proof.end_deadline == proof.at + timedelta(seconds=END_S)
    assert isinstance(cancel, CancelDecided)
    assert (cancel.cause, cancel.due) == ("end_timeout", proof.end_deadline)
    assert timedelta(0) <= cancel.at - proof.end_deadline < timedelta(seconds=ON_TIME_S)
    assert kinds(events).count("proof_seen") == 1  # not told again at the end
    (ended,) = [e for e in events if isinstance(e, RunEnded)]
    assert ended.state is RunState.STOPPED  # the proof is kept: cancelled with a checkpoint
    # `job_cancelled` is told when the cancel returns: it may come after the retrieval.
    (home,) = [e for e in events if isinstance(e, RetrievalDone)]
    assert home.checkpoint_digest == digest_of(api.get_run(hanging.id))

    # 4. The cost policy decides, then asks like any producer.
    events = ledger_when(pipeline, costly.id, "retrieval_done")
    first = kinds(events).index("stop_opened")
    assert set(kinds(events)[:first]) == {"policy_decision"}
    decision, opened = events[first - 1], events[first]
    assert isinstance(decision, PolicyDecision)
    assert decision.policy is SnapshotReason.COST
    assert "cost" in decision.why
    assert isinstance(opened, StopOpened)
    assert (opened.asked_by, opened.reason) == ("policy:cost", "cost")
    assert kinds(events)[first:] == ["stop_opened", "proof_seen", "run_ended", "retrieval_done"]

    # 5. A person's cancel: who asked, no stop, no deadline.
    events = ledger_when(pipeline, cancelled.id, "run_ended")
    first = events[0]
    assert isinstance(first, CancelDecided)
    assert (first.cause, first.asked_by, first.due, first.stop_id) == (
        "manual", "operator", None, None,
    )  # fmt: skip
    assert "job_cancelled" in kinds(events)

    # The CLI: every run's history, newest first; one run's; and `show --json`.
    runs = (proving, ignoring, hanging, costly, cancelled)
    everything = json.loads(ok(run_cli(pipeline.env, "stops", "--history", "--json")))
    assert {e["run_id"] for e in everything} == {r.id for r in runs}
    assert len(everything) == sum(len(api.ledger(r.id)) for r in runs)
    times = [e["at"] for e in everything]
    assert times == sorted(times, reverse=True)
    one = json.loads(ok(run_cli(pipeline.env, "stops", "--history", ignoring.id, "--json")))
    assert one == [e.model_dump(mode="json") for e in reversed(api.ledger(ignoring.id))]
    shown = json.loads(ok(run_cli(pipeline.env, "show", ignoring.id, "--json")))
    assert shown["ledger"] == [e.model_dump(mode="json") for e in api.ledger(ignoring.id)]
    table = ok(run_cli(pipeline.env, "stops", "--history"))
    for needle in ("cancel decided: proof timeout", "cancel decided: end timeout",
                   "asked by operator/svc-trainer-ops", "policy:cost",
                   "proof seen by the follow", "manual (asked by operator)",
                   "artifacts retrieved", proving.id, costly.id):  # fmt: skip
        assert needle in table, table
    text = ok(run_cli(pipeline.env, "show", hanging.id))
    assert "proof seen by the follow" in text
    refused(run_cli(pipeline.env, "stops", proving.id), 2, "a run id goes with --history")
    refused(run_cli(pipeline.env, "stops", "--history", "20990101-000000-nobody"), 2, "no run")
