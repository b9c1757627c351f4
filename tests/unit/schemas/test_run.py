"""`schemas.run`: how a finished job's run ends (`decide_outcome`), run limits, run
records, and the resume check."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import (
    TERMINAL_STATES,
    Artifacts,
    ArtifactsPhase,
    Container,
    JobId,
    JobStatus,
    NotResumable,
    ProofInvalid,
    ProofNone,
    ProofSaved,
    RunLimits,
    RunRecord,
    RunState,
    Snapshot,
    SnapshotReason,
    decide_outcome,
)
from schemas.job import JobEnd, parse_job_end
from schemas.run import check_resumable

from ..conftest import record as running_record


def saved(checkpoint: str, step: int, reason: SnapshotReason) -> ProofSaved:
    return ProofSaved(snapshot=Snapshot(checkpoint=checkpoint, step=step, reason=reason))


# --- outcomes ---------------------------------------------------------------------


SAVED = saved("output/checkpoint-120", 120, SnapshotReason.COST)
INVALID = ProofInvalid(why="snapshot.json names an invalid checkpoint path")
PROOFS: list[ProofNone | ProofSaved | ProofInvalid | None] = [
    None,
    ProofNone(),
    SAVED,
    INVALID,
]


@pytest.mark.parametrize("proof_read", PROOFS)
def test_exited_zero(proof_read: ProofNone | ProofSaved | ProofInvalid | None) -> None:
    outcome = decide_outcome(JobStatus.exited(0), proof_read)
    if isinstance(proof_read, ProofSaved):
        assert outcome.state is RunState.STOPPED
        assert outcome.snapshot == SAVED.snapshot
    elif isinstance(proof_read, ProofInvalid):
        assert outcome.state is RunState.FAILED
        assert outcome.snapshot is None
        assert outcome.message == f"the job stopped with a snapshot, but {INVALID.why}"
    else:
        assert outcome.state is RunState.SUCCEEDED
        assert outcome.snapshot is None


@pytest.mark.parametrize("code", [1, 3, 2, 137, -1, 255, 2**31 - 1, -(2**31)])
@pytest.mark.parametrize("proof_read", PROOFS)
def test_exited_non_zero_fails_whatever_the_proof(
    code: int, proof_read: ProofNone | ProofSaved | ProofInvalid | None
) -> None:
    outcome = decide_outcome(JobStatus.exited(code), proof_read)
    assert outcome.state is RunState.FAILED
    if isinstance(proof_read, ProofSaved):
        # A proof is never thrown away: the snapshot stays, and the message says so.
        assert outcome.snapshot == SAVED.snapshot
        assert outcome.message == (
            f"the job exited with code {code} after saving a snapshot at step 120 (cost)"
        )
    else:
        assert outcome.message == f"the job exited with code {code}"
        assert outcome.snapshot is None


@pytest.mark.parametrize("proof_read", PROOFS)
def test_cancelled(proof_read: ProofNone | ProofSaved | ProofInvalid | None) -> None:
    outcome = decide_outcome(JobStatus.CANCELLED, proof_read)
    if isinstance(proof_read, ProofSaved):
        assert outcome.state is RunState.STOPPED
        assert outcome.snapshot == SAVED.snapshot
    else:
        assert outcome.state is RunState.CANCELLED
        assert outcome.snapshot is None


@pytest.mark.parametrize("proof_read", PROOFS)
def test_lost_fails_whatever_the_proof(
    proof_read: ProofNone | ProofSaved | ProofInvalid | None,
) -> None:
    outcome = decide_outcome(JobStatus.LOST, proof_read)
    assert outcome.state is RunState.FAILED
    if isinstance(proof_read, ProofSaved):
        assert outcome.snapshot == SAVED.snapshot
        assert outcome.message == (
            "the job stopped without an exit code after saving a snapshot at step 120 (cost)"
        )
    else:
        assert outcome.message == "the job stopped without an exit code"
        assert outcome.snapshot is None


@pytest.mark.parametrize(
    ("code", "signal", "stopped"),
    [
        (143, None, True),  # SIGTERM by every numbering
        (138, None, True),  # SIGUSR1 on Linux
        (158, "USR1", True),  # SIGUSR1 where the target numbers it 30
        (158, None, False),  # unknown: 30 is no notice signal on Linux
        (137, None, False),  # SIGKILL asks for nothing
        (139, "SEGV", False),
        (15, "TERM", False),  # an exit code, not a signal
    ],
)
@pytest.mark.parametrize(
    "reason", [SnapshotReason.PREEMPTED, SnapshotReason.DEADLINE, SnapshotReason.COST]
)
def test_a_job_that_saved_then_ended_on_the_asking_signal_is_stopped(
    code: int, signal: str | None, stopped: bool, reason: SnapshotReason
) -> None:
    proof = saved("output/checkpoint-14", 14, reason)
    end = JobEnd(signal=signal)
    outcome = decide_outcome(JobStatus.exited(code), proof, end)
    assert outcome.snapshot == proof.snapshot
    if stopped and reason is not SnapshotReason.COST:
        assert outcome.state is RunState.STOPPED
        name = signal or {143: "TERM", 138: "USR1"}[code]
        assert outcome.message == (
            f"stopped with a snapshot at step 14 ({reason}); the job then ended on SIG{name}"
        )
    else:
        assert outcome.state is RunState.FAILED


def test_the_leftover_processes_are_in_the_message() -> None:
    two = JobEnd(leftovers=2)
    assert decide_outcome(JobStatus.exited(0), None, two).message == "2 leftover processes ended"
    failed = decide_outcome(JobStatus.exited(3), None, JobEnd(leftovers=1))
    assert failed.message == "the job exited with code 3; 1 leftover process ended"
    stubborn = decide_outcome(JobStatus.exited(0), None, JobEnd(leftovers=3, survived=1))
    assert stubborn.message == "3 leftover processes: 2 ended, 1 survived SIGKILL"
    waited = decide_outcome(JobStatus.exited(0), SAVED, JobEnd(waited=2))
    assert waited.message == (
        "stopped with a snapshot at step 120 (cost); waited for 2 leftover processes"
    )
    # Only a job that exited has a word of the wrapper's: a cancel ended the others.
    assert decide_outcome(JobStatus.CANCELLED, None, two).message == "the job was cancelled"


def test_the_wrappers_end_file_is_parsed_leniently() -> None:
    assert parse_job_end(b"") is None
    end = parse_job_end(b"signal TERM\nleftovers 2\nsurvived 1\njunk\nwaited x\n")
    assert end == JobEnd(signal="TERM", leftovers=2, survived=1)
    assert parse_job_end(b"signal $(rm)\nleftovers 99999999999\n") == JobEnd()


@pytest.mark.parametrize("proof_read", PROOFS)
def test_running_has_no_outcome(proof_read: ProofNone | ProofSaved | ProofInvalid | None) -> None:
    with pytest.raises(ValueError, match="running"):
        decide_outcome(JobStatus.RUNNING, proof_read)


def test_every_outcome_is_terminal() -> None:
    for status in [JobStatus.exited(0), JobStatus.exited(1), JobStatus.CANCELLED, JobStatus.LOST]:
        for proof_read in PROOFS:
            assert decide_outcome(status, proof_read).state.is_terminal
    expected = {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.STOPPED}
    assert expected == TERMINAL_STATES
    assert not RunState.PREPARING.is_terminal
    assert not RunState.RUNNING.is_terminal


# --- run limits and records -------------------------------------------------------


def test_run_limits() -> None:
    assert RunLimits() == RunLimits(max_hours=None, max_cost_usd=None, usd_per_hour=None)
    assert RunLimits(max_cost_usd=10, usd_per_hour=1.5).max_cost_usd == 10
    assert RunLimits(usd_per_hour=1.5).max_cost_usd is None
    with pytest.raises(ValidationError, match="usd_per_hour"):
        RunLimits(max_cost_usd=10)
    for field in ["max_hours", "max_cost_usd", "usd_per_hour"]:
        for bad in [0, -1]:
            with pytest.raises(ValidationError):
                RunLimits.model_validate({"usd_per_hour": 1, field: bad})
    with pytest.raises(ValidationError):
        RunLimits.model_validate({"max_hours": 1, "other": 2})


def test_limits_refuse_nonsense() -> None:
    for bad in ({"max_hours": 0}, {"max_hours": float("inf")}, {"max_hours": 300_000},
                {"max_cost_usd": 5},
                {"usd_per_hour": float("nan")}):  # fmt: skip
        with pytest.raises(ValueError, match="validation error"):
            RunLimits(**bad)


def record() -> RunRecord:
    return RunRecord(
        id="20261130-022518-exp",
        target="gpu-1",
        created=datetime(2026, 11, 30, 2, 25, 18, tzinfo=UTC),
        remote_dir="/w/20261130-022518-exp",
        job=JobId(
            dir="/w/20261130-022518-exp", pid=4242, container=Container(engine="docker", name="c")
        ),
        state=RunState.STOPPED,
        message="stopped with a snapshot at step 120 (cost)",
        snapshot=Snapshot(checkpoint="output/checkpoint-120", step=120, reason=SnapshotReason.COST),
        resumed_from="20261129-000000",
        snapshots=True,
        command="python train.py",
        limits=RunLimits(max_hours=2, max_cost_usd=10, usd_per_hour=1.5),
    )


def test_run_record_round_trips_through_json() -> None:
    run = record()
    text = run.model_dump_json()
    assert RunRecord.model_validate_json(text) == run
    shape = json.loads(text)
    assert shape["job"] == {
        "dir": "/w/20261130-022518-exp",
        "pid": 4242,
        "container": {"engine": "docker", "name": "c"},
    }
    assert shape["snapshot"] == {
        "checkpoint": "output/checkpoint-120",
        "step": 120,
        "reason": "cost",
    }
    assert shape["state"] == "stopped"
    assert RunRecord.model_validate(shape) == run


def test_run_record_defaults_and_time_zones() -> None:
    run = RunRecord(id="r1", target="local", created=datetime(2026, 1, 1, 12), remote_dir="/w/r1")
    assert run.state is RunState.PREPARING
    assert run.job is None
    assert run.snapshot is None
    assert run.snapshots is True
    assert run.limits == RunLimits()
    assert run.created == datetime(2026, 1, 1, 12, tzinfo=UTC)
    shifted = RunRecord(
        id="r1",
        target="local",
        created=datetime(2026, 1, 1, 14, tzinfo=timezone(timedelta(hours=2))),
        remote_dir="/w/r1",
    )
    assert shifted.created == datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert shifted.created.utcoffset() == timedelta(0)
    assert RunRecord.model_validate_json(run.model_dump_json()) == run


@pytest.mark.parametrize(
    "change",
    [
        {"id": "../x"},
        {"id": "UPPER"},
        {"resumed_from": "a/b"},
        {"remote_dir": "relative"},
        {"target": ""},
        {"target": "x" * 65},
        {"state": "done"},
        {"unknown": 1},
        {"job": {"dir": "/w", "pid": 1, "container": None}},
        {"limits": {"max_cost_usd": 5}},
    ],
)
def test_run_record_refuses_bad_fields(change: dict[str, Any]) -> None:
    shape = json.loads(record().model_dump_json()) | change
    with pytest.raises(ValidationError):
        RunRecord.model_validate(shape)


# --- resume check -----------------------------------------------------------------


def stopped(**changes: Any) -> RunRecord:
    snap = Snapshot(checkpoint="output/checkpoint-7", step=7, reason=SnapshotReason.COST)
    base: dict[str, Any] = {
        "state": RunState.STOPPED,
        "snapshot": snap,
        "artifacts": Artifacts(phase=ArtifactsPhase.DONE, files=3, bytes=10),
    }
    base.update(changes)
    return running_record(**base)


def test_a_stopped_run_with_its_artifacts_is_resumable() -> None:
    assert check_resumable(stopped()).step == 7


def test_a_failed_run_that_proved_a_snapshot_is_resumable() -> None:
    # Its job proved a snapshot, then exited non-zero or was lost: the proof stays.
    assert check_resumable(stopped(state=RunState.FAILED)).step == 7
    with pytest.raises(NotResumable, match="failed, not stopped"):
        check_resumable(stopped(state=RunState.FAILED, snapshot=None))
    with pytest.raises(NotResumable, match="cancelled, not stopped"):
        check_resumable(stopped(state=RunState.CANCELLED))


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"state": RunState.SUCCEEDED, "snapshot": None}, "succeeded, not stopped"),
        ({"state": RunState.RUNNING, "snapshot": None}, "running, not stopped"),
        ({"artifacts": None}, "no retrieval was recorded"),
        (
            {"artifacts": Artifacts(attempts=2, error="ssh: connection refused")},
            "retrieval is pending (last error: ssh: connection refused)",
        ),
        ({"artifacts": Artifacts(phase=ArtifactsPhase.FAILED)}, "retrieval is failed"),
    ],
)
def test_resume_is_refused_with_the_reason(changes: dict[str, Any], why: str) -> None:
    with pytest.raises(NotResumable) as caught:
        check_resumable(stopped(**changes))
    assert why in str(caught.value)
    assert str(caught.value).startswith("run 'r1' cannot be resumed")
    rebuilt = NotResumable(*caught.value.args)  # Celery's JSON backend does this
    assert str(rebuilt) == str(caught.value)
