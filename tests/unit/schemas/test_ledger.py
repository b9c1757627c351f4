"""`schemas.ledger`: the events built from stops and runs, their JSON, the fold that
finds a run's open stop, the checkpoint digest, and what each event moves in the
metrics (`schemas.metrics`)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from schemas import Artifacts, ArtifactsPhase, RunState, Snapshot, SnapshotReason, StopPhase
from schemas.budget import StopBudget, TimeoutSource
from schemas.ledger import (
    LEDGER_EVENT,
    TEXT_MAX,
    CancelDecided,
    JobCancelled,
    PolicyDecision,
    ProofSeen,
    RetrievalDone,
    RetrievalFailed,
    RunEnded,
    StopOpened,
    checkpoint_digest,
    open_stop_of,
    retrieval_event,
)
from schemas.metrics import (
    CANCELS,
    DEADLINE_LATENESS,
    EVENTS,
    FOLLOW_TICK,
    PROOF_LATENCY,
    RETRIEVALS,
    RETRIEVED_BYTES,
    bucket_index,
    event_samples,
)
from schemas.stops import StopState

from ..conftest import T0, record

SNAP = Snapshot(checkpoint="output/checkpoint-40", step=40, reason=SnapshotReason.REQUESTED)


def stop(phase: StopPhase = StopPhase.WAITING_PROOF, **changes: object) -> StopState:
    base: dict[str, object] = {
        "run_id": "r1",
        "stop_id": "abcdef0123456789",
        "phase": phase,
        "reason": SnapshotReason.DISK,
        "asked_by": "policy:disk",
        "asked_at": T0,
        "proof_deadline": T0 + timedelta(seconds=60),
    }
    base.update(changes)
    return StopState.model_validate(base)


def test_a_stop_opened_carries_who_asked_why_when_and_its_deadline() -> None:
    event = StopOpened.of(stop())
    assert (event.run_id, event.stop_id, event.kind) == ("r1", "abcdef0123456789", "stop_opened")
    assert (event.reason, event.asked_by, event.at) == ("disk", "policy:disk", T0)
    assert event.proof_deadline == T0 + timedelta(seconds=60)
    assert "asked by policy:disk" in event.describe()
    assert (event.proof_timeout_s, event.timeout_source) == (None, None)


def test_a_stop_opened_says_which_proof_timeout_it_got() -> None:
    budget = StopBudget(proof_timeout_s=8.46, end_timeout_s=4, source=TimeoutSource.LEARNED,
                        why="3 x 2.5 s (the longest of 1 save) + 1 s")  # fmt: skip
    event = StopOpened.of(stop(proof_deadline=T0 + timedelta(seconds=8.46), budget=budget))
    assert (event.proof_timeout_s, event.timeout_source) == (8.46, "learned")
    assert event.describe().endswith(" (8.5 s, learned)")
    again = StopOpened.model_validate_json(event.model_dump_json())
    assert again == event


@pytest.mark.parametrize(
    ("phase", "cause", "due_s"),
    [
        (StopPhase.WAITING_PROOF, "proof_timeout", 60),
        (StopPhase.WAITING_END, "end_timeout", 90),
        (StopPhase.CANCELLING, "retry", 90),
    ],
)
def test_the_cause_of_a_cancel_is_the_phase_it_was_decided_in(
    phase: StopPhase, cause: str, due_s: int
) -> None:
    cancels = 1 if cause == "retry" else 0
    read = stop(phase, end_deadline=T0 + timedelta(seconds=90), cancels=cancels)
    event = CancelDecided.of(read, "x" * (TEXT_MAX + 50), T0 + timedelta(seconds=100))
    assert event.cause == cause
    assert event.due == T0 + timedelta(seconds=due_s)
    assert event.attempt == (2 if cause == "retry" else 1)
    assert event.note is not None
    assert len(event.note) == TEXT_MAX  # cut, never refused


def test_every_event_reads_back_as_itself_by_its_kind() -> None:
    now = T0 + timedelta(seconds=5)
    events = [
        StopOpened.of(stop()),
        ProofSeen.at_deadline(stop(), SNAP, now, now + timedelta(seconds=30)),
        CancelDecided.manual("r1", now),
        JobCancelled.of("r1", now),
        RunEnded.of(record(state=RunState.STOPPED, snapshot=SNAP, ended=now, message="m"), now),
        RetrievalDone(
            run_id="r1", at=now, files=2, bytes=10, attempts=1, checkpoint_digest="01" * 32
        ),
        RetrievalFailed(run_id="r1", at=now, attempts=3, error="boom", gave_up=True),
        PolicyDecision.of("r1", SnapshotReason.COST, "95 % of the cap", now),
    ]
    for event in events:
        assert LEDGER_EVENT.validate_json(event.model_dump_json()) == event
        assert event.describe()
    assert len({e.id for e in events}) == len(events)


def test_the_checkpoint_digest_is_sha256_of_its_sorted_path_and_hash_lines() -> None:
    files = [
        ("output/checkpoint-40/b.bin", "b" * 64),
        ("job.log", "1" * 64),
        ("output/checkpoint-40/a.bin", "a" * 64),
        ("output/checkpoint-400/x", "2" * 64),  # another checkpoint: not a prefix match
    ]
    text = f"output/checkpoint-40/a.bin {'a' * 64}\noutput/checkpoint-40/b.bin {'b' * 64}\n"
    expected = hashlib.sha256(text.encode()).hexdigest()
    assert checkpoint_digest(files, "output/checkpoint-40") == expected
    assert checkpoint_digest(reversed(files), "output/checkpoint-40") == checkpoint_digest(
        files, "output/checkpoint-40"
    )
    assert checkpoint_digest(files, "output/checkpoint-7") is None


def test_a_retrieval_result_becomes_done_failed_or_nothing() -> None:
    run = record(state=RunState.STOPPED, snapshot=SNAP)
    done = Artifacts(phase=ArtifactsPhase.DONE, attempts=2, files=3, bytes=99, path="/a/r1")
    event = retrieval_event(run, done, T0, "f" * 64)
    assert isinstance(event, RetrievalDone)
    assert (event.files, event.bytes, event.attempts) == (3, 99, 2)
    assert event.checkpoint_digest == "f" * 64
    failed = retrieval_event(run, Artifacts(phase=ArtifactsPhase.FAILED, attempts=5, error="e"), T0)
    assert isinstance(failed, RetrievalFailed)
    assert failed.gave_up
    retry = retrieval_event(run, Artifacts(attempts=1, error="e"), T0)
    assert isinstance(retry, RetrievalFailed)
    assert not retry.gave_up
    assert retrieval_event(run, Artifacts(), T0) is None


def test_the_open_stop_is_the_newest_opened_and_not_ended() -> None:
    first = StopOpened.of(stop())
    second = StopOpened.of(stop(stop_id="fedcba9876543210", asked_at=T0 + timedelta(hours=1)))
    ended = RunEnded.of(record(state=RunState.CANCELLED, ended=T0), T0)
    assert open_stop_of([]) is None
    assert open_stop_of([first, ended]) is None
    found = open_stop_of([first, ended, second])
    assert found is not None
    assert (found.stop_id, found.asked_at, found.proved) == ("fedcba9876543210", second.at, False)
    proof = ProofSeen.at_deadline(stop(stop_id="fedcba9876543210"), SNAP, T0, None)
    found = open_stop_of([first, ended, second, proof])
    assert found is not None
    assert found.proved


def test_what_each_event_moves_in_the_metrics() -> None:
    asked = stop(asked_at=T0, proof_deadline=T0 + timedelta(seconds=60))
    proof = ProofSeen.at_deadline(asked, SNAP, T0 + timedelta(seconds=61.5), None)
    moved = {(s.spec.name, s.labels): s.value for s in event_samples(proof)}
    assert moved == {
        (EVENTS.name, ("proof_seen",)): 1.0,
        (PROOF_LATENCY.name, ()): 61.5,
        (DEADLINE_LATENESS.name, ("proof",)): 1.5,
    }
    cancel = CancelDecided.of(asked, "no proof", T0 + timedelta(seconds=59.8))  # a bit early
    moved = {(s.spec.name, s.labels): s.value for s in event_samples(cancel)}
    assert moved[(CANCELS.name, ("proof_timeout",))] == 1.0
    assert moved[(DEADLINE_LATENESS.name, ("proof",))] == 0.0
    retry = CancelDecided.of(stop(StopPhase.CANCELLING, cancels=1), "again", T0)
    assert CANCELS.name not in {s.spec.name for s in event_samples(retry)}
    done = RetrievalDone(run_id="r1", at=T0, files=1, bytes=4096, attempts=1)
    moved = {(s.spec.name, s.labels): s.value for s in event_samples(done)}
    assert moved[(RETRIEVALS.name, ("done",))] == 1.0
    assert moved[(RETRIEVED_BYTES.name, ())] == 4096.0


def test_a_value_falls_in_the_first_bucket_that_holds_it() -> None:
    assert FOLLOW_TICK.buckets[0] == 0.05
    assert bucket_index(FOLLOW_TICK, 0.0) == 0
    assert bucket_index(FOLLOW_TICK, 0.05) == 0
    assert bucket_index(FOLLOW_TICK, 0.06) == 1
    assert bucket_index(FOLLOW_TICK, 1e9) == len(FOLLOW_TICK.buckets)


def test_an_event_at_is_utc() -> None:
    naive = datetime(2026, 1, 1, 12, 0)
    event = JobCancelled.of("r1", naive)
    assert event.at.tzinfo is UTC
