"""`schemas`: the seeds' snapshot tests ported, the proof parser's edge cases, the JSON
shapes shared with the seeds' serde types, outcomes, run ids, paths and job commands."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from schemas import (
    END_TIMEOUT_S,
    PROOF_TIMEOUT_S,
    REQUEST_POLL_S,
    TERMINAL_STATES,
    Container,
    InvalidPath,
    InvalidRunId,
    JobCommand,
    JobId,
    JobStatus,
    ProofInvalid,
    ProofNone,
    ProofSaved,
    RunLimits,
    RunRecord,
    RunState,
    SchemaError,
    Settings,
    Snapshot,
    SnapshotReason,
    check_pid,
    decide_outcome,
    expected_checkpoint,
    join_run_path,
    new_run_id,
    next_run_id,
    parse_proof,
    safe_relpath,
    validate_run_id,
)
from schemas.protocol import PROOF_LIMIT

U64_MAX = 2**64 - 1
LINE_COLUMN = re.compile(r"\(line \d+, column \d+\)")


def proof(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def saved(checkpoint: str, step: int, reason: SnapshotReason) -> ProofSaved:
    return ProofSaved(snapshot=Snapshot(checkpoint=checkpoint, step=step, reason=reason))


# --- the seeds' tests (000_…, the snapshot module) ----------------------------------


def test_a_proof_names_its_checkpoint_step_and_reason() -> None:
    got = parse_proof(
        b'{"checkpoint": "output/checkpoint-120", "step": 120, "time": 1.5, "reason": "cost"}'
    )
    assert got == saved("output/checkpoint-120", 120, SnapshotReason.COST)
    without = parse_proof(b'{"checkpoint": "output/checkpoint-1", "step": 1}')
    assert isinstance(without, ProofSaved), without
    assert without.snapshot.reason is SnapshotReason.REQUESTED
    assert parse_proof(b"") == ProofNone()
    assert parse_proof(b" \n") == ProofNone()


@pytest.mark.parametrize(
    "checkpoint",
    [
        "/etc/passwd",
        "../other",
        "output/../..",
        "output//checkpoint-1",
        "output/./checkpoint-1",
        "output/check point",
        "output/other-1",
        "output/checkpoint-2",
        "output/checkpoint-1/x",
        "checkpoint-1",
        "",
    ],
)
def test_a_proof_never_names_a_path_outside_the_run(checkpoint: str) -> None:
    text = json.dumps({"checkpoint": checkpoint, "step": 1})
    assert isinstance(parse_proof(text.encode()), ProofInvalid), checkpoint


def test_a_proof_that_is_not_json_is_invalid() -> None:
    got = parse_proof(b"{not json")
    assert isinstance(got, ProofInvalid)
    assert LINE_COLUMN.search(got.why), got.why


def test_reasons_read_back_and_default_to_requested() -> None:
    for reason in SnapshotReason:
        assert SnapshotReason.parse(reason.value) is reason
    assert SnapshotReason.parse(" deadline\n") is SnapshotReason.DEADLINE
    assert SnapshotReason.parse("anything") is SnapshotReason.REQUESTED
    assert SnapshotReason.parse("") is SnapshotReason.REQUESTED
    assert SnapshotReason.parse(None) is SnapshotReason.REQUESTED
    assert SnapshotReason.parse(b"disk\n") is SnapshotReason.DISK
    assert SnapshotReason.parse(b"\xff\xfe") is SnapshotReason.REQUESTED
    assert SnapshotReason.parse("COST") is SnapshotReason.REQUESTED
    assert [r.value for r in SnapshotReason] == ["requested", "deadline", "cost", "disk"]


# --- parse_proof edge cases ---------------------------------------------------------


@pytest.mark.parametrize("blank", [b"", b" ", b"\t\r\n", b"\x0c", b"  \n\n  \t"])
def test_ascii_whitespace_is_no_proof(blank: bytes) -> None:
    assert parse_proof(blank) == ProofNone()


@pytest.mark.parametrize("content", [b"\x0b", b"\xa0", "\u2003".encode(), b"\x00"])
def test_other_blank_looking_bytes_are_invalid(content: bytes) -> None:
    # Rust's `u8::is_ascii_whitespace` has no vertical tab; nothing non-ASCII counts.
    assert isinstance(parse_proof(content), ProofInvalid)


@pytest.mark.parametrize(
    "content",
    [
        b"\xff",
        b'{"checkpoint": "output/checkpoint-1", "step": 1, "reason": "\xff"}',
        b'{"checkpoint": "output/checkpoint-1\xc3", "step": 1}',
        b"\xef\xbb\xbf" + proof(checkpoint="output/checkpoint-1", step=1),
    ],
)
def test_non_utf8_or_bom_is_invalid(content: bytes) -> None:
    assert isinstance(parse_proof(content), ProofInvalid)


@pytest.mark.parametrize(
    "content", [b"[]", b"[1, 2]", b'"output/checkpoint-1"', b"1", b"null", b"true", b"1.5"]
)
def test_json_that_is_not_an_object_is_invalid(content: bytes) -> None:
    got = parse_proof(content)
    assert isinstance(got, ProofInvalid)
    assert "object" in got.why


@pytest.mark.parametrize(
    "step",
    [True, False, -1, 1.0, 1.5, "1", None, [1], {"n": 1}, 2**64, -(2**63), 10**30],
)
def test_a_step_that_is_not_a_u64_is_invalid(step: Any) -> None:
    content = proof(checkpoint="output/checkpoint-1", step=step)
    got = parse_proof(content)
    assert isinstance(got, ProofInvalid), (step, got)
    assert "step" in got.why


def test_missing_fields_are_invalid() -> None:
    assert isinstance(parse_proof(b"{}"), ProofInvalid)
    assert isinstance(parse_proof(proof(step=1)), ProofInvalid)
    assert isinstance(parse_proof(proof(checkpoint="output/checkpoint-1")), ProofInvalid)
    assert isinstance(parse_proof(proof(checkpoint=None, step=1)), ProofInvalid)
    assert isinstance(parse_proof(proof(checkpoint=["output/checkpoint-1"], step=1)), ProofInvalid)


def test_the_largest_step_is_valid() -> None:
    got = parse_proof(proof(checkpoint=f"output/checkpoint-{U64_MAX}", step=U64_MAX))
    assert got == saved(f"output/checkpoint-{U64_MAX}", U64_MAX, SnapshotReason.REQUESTED)
    assert parse_proof(proof(checkpoint="output/checkpoint-0", step=0)) == saved(
        "output/checkpoint-0", 0, SnapshotReason.REQUESTED
    )


@pytest.mark.parametrize("reason", [1, 1.5, True, ["cost"], {"r": "cost"}])
def test_a_reason_that_is_not_a_string_is_invalid(reason: Any) -> None:
    got = parse_proof(proof(checkpoint="output/checkpoint-1", step=1, reason=reason))
    assert isinstance(got, ProofInvalid)
    assert "reason" in got.why


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (None, SnapshotReason.REQUESTED),
        ("cost", SnapshotReason.COST),
        (" disk \n", SnapshotReason.DISK),
        ("deadline", SnapshotReason.DEADLINE),
        ("Cost", SnapshotReason.REQUESTED),
        ("", SnapshotReason.REQUESTED),
        ("$(touch PWNED)", SnapshotReason.REQUESTED),
    ],
)
def test_reasons_in_a_proof(reason: str | None, expected: SnapshotReason) -> None:
    got = parse_proof(proof(checkpoint="output/checkpoint-7", step=7, reason=reason))
    assert got == saved("output/checkpoint-7", 7, expected)


def test_a_checkpoint_with_a_leading_zero_or_sign_is_invalid() -> None:
    for checkpoint in ["output/checkpoint-07", "output/checkpoint-+7", "output/checkpoint-7 "]:
        assert isinstance(parse_proof(proof(checkpoint=checkpoint, step=7)), ProofInvalid)


@pytest.mark.parametrize(
    "content",
    [
        b"[" * 100_000,
        b"{" * 100_000,
        b'{"checkpoint": "output/checkpoint-1", "step": 1, "x": ' + b"[" * 100_000,
        b'{"checkpoint": "output/checkpoint-1", "step": 1, "x": '
        + b"[" * 50_000
        + b"]" * 50_000
        + b"}",
    ],
)
def test_deeply_nested_json_is_invalid_not_a_crash(content: bytes) -> None:
    assert isinstance(parse_proof(content), ProofInvalid)


@pytest.mark.parametrize("digits", [25, 4_300, 5_000, 60_000])
def test_huge_integers_are_invalid(digits: int) -> None:
    content = b'{"checkpoint": "output/checkpoint-1", "step": ' + b"9" * digits + b"}"
    assert isinstance(parse_proof(content), ProofInvalid)
    ignored = b'{"checkpoint": "output/checkpoint-1", "step": 1, "time": ' + b"9" * digits + b"}"
    # In an ignored field it is read or refused, never raised.
    assert isinstance(parse_proof(ignored), (ProofInvalid, ProofSaved))


def test_a_proof_cut_at_64_kib_is_invalid_with_line_and_column() -> None:
    whole = (
        b'{\n  "checkpoint": "output/checkpoint-1",\n  "step": 1,\n  "pad": "'
        + b"x" * (2 * PROOF_LIMIT)
        + b'"\n}'
    )
    assert isinstance(parse_proof(whole), ProofSaved)
    got = parse_proof(whole[:PROOF_LIMIT])
    assert isinstance(got, ProofInvalid)
    assert got.why.startswith("snapshot.json is not valid"), got.why
    match = re.search(r"\(line (\d+), column (\d+)\)", got.why)
    assert match is not None, got.why
    assert int(match[1]) == 4  # the unterminated string starts on line 4


@pytest.mark.parametrize(
    ("content", "line"),
    [(b"{\n\n  oops", 3), (b'{"checkpoint": "output/checkpoint-1",\n "step": 1,,}', 2)],
)
def test_syntax_errors_say_line_and_column(content: bytes, line: int) -> None:
    got = parse_proof(content)
    assert isinstance(got, ProofInvalid)
    assert f"(line {line}, column " in got.why, got.why


def test_extra_fields_and_time_are_ignored() -> None:
    content = proof(
        checkpoint="output/checkpoint-3",
        step=3,
        reason="disk",
        time="not even a number",
        extra={"nested": [1, 2, 3]},
        checkpoints=["/etc/passwd"],
    )
    assert parse_proof(content) == saved("output/checkpoint-3", 3, SnapshotReason.DISK)
    times: list[Any] = [1.5, None, -1, "x", [], {}]
    for time in times:
        content = proof(checkpoint="output/checkpoint-3", step=3, time=time)
        assert parse_proof(content) == saved("output/checkpoint-3", 3, SnapshotReason.REQUESTED)


def test_surrounding_whitespace_is_fine() -> None:
    content = b" \n\t" + proof(checkpoint="output/checkpoint-2", step=2) + b"\n\n"
    assert parse_proof(content) == saved("output/checkpoint-2", 2, SnapshotReason.REQUESTED)


def test_trailing_garbage_is_invalid() -> None:
    content = proof(checkpoint="output/checkpoint-2", step=2) + b" {}"
    assert isinstance(parse_proof(content), ProofInvalid)


def test_expected_checkpoint() -> None:
    assert expected_checkpoint(0) == "output/checkpoint-0"
    assert expected_checkpoint(120) == "output/checkpoint-120"


# --- JSON shapes shared with the seeds' serde types --------------------------------


def test_job_id_shape_round_trips() -> None:
    text = '{"dir":"/w/r1","pid":42,"container":null}'
    job = JobId.model_validate_json(text)
    assert job == JobId(dir="/w/r1", pid=42)
    assert job.model_dump_json() == text
    assert json.loads(job.model_dump_json()) == {"dir": "/w/r1", "pid": 42, "container": None}
    assert JobId.model_validate({"dir": "/w/r1", "pid": 42}) == job  # serde: Option defaults


def test_job_id_with_a_container() -> None:
    text = '{"dir":"/w/r1","pid":42,"container":{"engine":"docker","name":"x"}}'
    job = JobId.model_validate_json(text)
    assert job.container == Container(engine="docker", name="x")
    assert job.model_dump_json() == text
    assert Container(engine="podman", name="a.b_c-1").model_dump() == {
        "engine": "podman",
        "name": "a.b_c-1",
    }


@pytest.mark.parametrize("pid", [0, 1, -5, True, False, "42", 42.0, None, 2**31, 2**40])
def test_job_id_refuses_bad_pids(pid: Any) -> None:
    with pytest.raises(ValidationError):
        JobId.model_validate({"dir": "/w/r1", "pid": pid, "container": None})
    with pytest.raises(ValidationError):
        JobId.model_validate_json(json.dumps({"dir": "/w/r1", "pid": pid, "container": None}))


@pytest.mark.parametrize("pid", [2, 42, 2**31 - 1])
def test_job_id_accepts_valid_pids(pid: int) -> None:
    assert JobId(dir="/w", pid=pid).pid == pid
    assert check_pid(pid) == pid


@pytest.mark.parametrize("pid", [0, 1, -1, 2**31])
def test_check_pid_refuses(pid: int) -> None:
    with pytest.raises(ValueError, match="invalid process id"):
        check_pid(pid)


def test_check_pid_refuses_non_integers() -> None:
    for pid in [True, "42", 42.0]:
        with pytest.raises(ValueError, match="integer"):
            check_pid(pid)  # type: ignore[arg-type]


@pytest.mark.parametrize("directory", ["w/r1", "", "./r1", "/w/r\0"])
def test_job_id_refuses_a_bad_dir(directory: str) -> None:
    with pytest.raises(ValidationError):
        JobId(dir=directory, pid=42)


def test_job_id_dir_may_hold_any_other_character() -> None:
    hostile = "/w/r $(touch PWNED) 'q' \"d\" `x` ;&|<>*\n"
    job = JobId(dir=hostile, pid=42)
    assert JobId.model_validate_json(job.model_dump_json()) == job


@pytest.mark.parametrize(
    "container",
    [
        {"engine": "Docker", "name": "x"},
        {"engine": "lxc", "name": "x"},
        {"engine": "docker", "name": ""},
        {"engine": "docker", "name": "-x"},
        {"engine": "docker", "name": "x y"},
        {"engine": "docker", "name": "x;rm"},
        {"engine": "docker", "name": "x" * 129},
        {"engine": "docker"},
    ],
)
def test_container_refuses_bad_values(container: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        Container.model_validate(container)


@pytest.mark.parametrize(
    ("status", "shape"),
    [
        (JobStatus.RUNNING, "running"),
        (JobStatus.exited(3), {"exited": 3}),
        (JobStatus.exited(0), {"exited": 0}),
        (JobStatus.exited(-1), {"exited": -1}),
        (JobStatus.exited(2**31 - 1), {"exited": 2**31 - 1}),
        (JobStatus.exited(-(2**31)), {"exited": -(2**31)}),
        (JobStatus.CANCELLED, "cancelled"),
        (JobStatus.LOST, "lost"),
    ],
)
def test_job_status_shapes_both_ways(status: JobStatus, shape: str | dict[str, int]) -> None:
    assert status.model_dump() == shape
    assert json.loads(status.model_dump_json()) == shape
    assert JobStatus.model_validate(shape) == status
    assert JobStatus.model_validate_json(json.dumps(shape)) == status


@pytest.mark.parametrize(
    "shape",
    [
        "exited",
        "Running",
        "done",
        "",
        {"exited": 2**31},
        {"exited": -(2**31) - 1},
        {"exited": 1.5},
        {"exited": None},
        {"exited": [3]},
        {"exited": 3, "running": 1},
        {"running": None},
        {"kind": "running", "code": 3},
        {"kind": "exited"},
        None,
        3,
    ],
)
def test_job_status_refuses_other_shapes(shape: Any) -> None:
    with pytest.raises(ValidationError):
        JobStatus.model_validate(shape)
    with pytest.raises(ValidationError):
        JobStatus.model_validate_json(json.dumps(shape))


def test_job_status_properties() -> None:
    assert not JobStatus.RUNNING.is_finished
    assert JobStatus.exited(0).is_finished
    assert JobStatus.CANCELLED.is_finished
    assert JobStatus.LOST.is_finished
    assert str(JobStatus.exited(3)) == "exited(3)"
    assert str(JobStatus.LOST) == "lost"
    assert JobStatus.exited(3) == JobStatus.model_validate({"exited": 3})
    assert JobStatus.exited(3) != JobStatus.exited(4)


def test_snapshot_shape() -> None:
    shape = {"checkpoint": "output/checkpoint-120", "step": 120, "reason": "cost"}
    snap = Snapshot.model_validate(shape)
    assert snap == Snapshot(
        checkpoint="output/checkpoint-120", step=120, reason=SnapshotReason.COST
    )
    assert json.loads(snap.model_dump_json()) == shape
    assert Snapshot.model_validate_json(json.dumps(shape)) == snap
    assert snap.model_dump(mode="json") == shape


@pytest.mark.parametrize(
    "shape",
    [
        {"checkpoint": "output/checkpoint-121", "step": 120, "reason": "cost"},
        {"checkpoint": "../x", "step": 120, "reason": "cost"},
        {"checkpoint": "output/checkpoint-120", "step": "120", "reason": "cost"},
        {"checkpoint": "output/checkpoint-120", "step": 120.0, "reason": "cost"},
        {"checkpoint": "output/checkpoint-120", "step": True, "reason": "cost"},
        {"checkpoint": "output/checkpoint--1", "step": -1, "reason": "cost"},
        {"checkpoint": "output/checkpoint-120", "step": 120, "reason": "Cost"},
        {"checkpoint": "output/checkpoint-120", "step": 120, "reason": "other"},
        {"checkpoint": "output/checkpoint-120", "step": 120},
        {"checkpoint": "output/checkpoint-120", "step": 120, "reason": "cost", "x": 1},
        {"checkpoint": f"output/checkpoint-{2**64}", "step": 2**64, "reason": "cost"},
    ],
)
def test_snapshot_refuses_other_shapes(shape: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Snapshot.model_validate(shape)


# --- stop limits ---------------------------------------------------------------------


def test_stop_limits_defaults() -> None:
    assert PROOF_TIMEOUT_S == 1800
    assert END_TIMEOUT_S == 600
    assert REQUEST_POLL_S == 30
    defaults = Settings()
    assert defaults.proof_timeout_s == PROOF_TIMEOUT_S
    assert defaults.end_timeout_s == END_TIMEOUT_S
    assert Settings(proof_timeout_s=1, end_timeout_s=2).end_timeout_s == 2
    for bad in [0, -1]:
        with pytest.raises(ValidationError):
            Settings(proof_timeout_s=bad)
        with pytest.raises(ValidationError):
            Settings(end_timeout_s=bad)


# --- outcomes ------------------------------------------------------------------------

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
    assert outcome.message == "the job stopped without an exit code"
    assert outcome.snapshot is None


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


# --- run limits and records ----------------------------------------------------------


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


# --- run ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run_id",
    ["r1", "a", "0", "20261130-022518", "20261130-022518-my-run-2", "a.b_c-d", "x" * 64, "9.."],
)
def test_valid_run_ids(run_id: str) -> None:
    assert validate_run_id(run_id) == run_id


@pytest.mark.parametrize(
    "run_id",
    [
        "",
        ".",
        "..",
        ".hidden",
        "-rf",
        "_x",
        "a/b",
        "/abs",
        "UPPER",
        "a b",
        "a\n",
        "a\0",
        "a$(x)",
        "a;b",
        "x" * 65,
        "é",
        "\uff521",
        "\u0661",
    ],
)
def test_invalid_run_ids(run_id: str) -> None:
    with pytest.raises(InvalidRunId, match="invalid run id"):
        validate_run_id(run_id)


def test_run_id_errors_are_schema_errors_and_bounded() -> None:
    assert issubclass(InvalidRunId, SchemaError)
    assert issubclass(SchemaError, ValueError)
    with pytest.raises(InvalidRunId) as raised:
        validate_run_id("A" * 10_000)
    assert len(str(raised.value)) < 300
    with pytest.raises(InvalidRunId, match="string"):
        validate_run_id(42)  # type: ignore[arg-type]


def test_new_run_id_format() -> None:
    now = datetime(2026, 11, 30, 2, 25, 18, tzinfo=UTC)
    assert new_run_id("My Run!", now=now) == "20261130-022518-my-run"
    assert new_run_id("", now=now) == "20261130-022518"
    assert new_run_id("ÄÖÜ", now=now) == "20261130-022518"
    assert new_run_id("$(rm -rf /); ../..", now=now) == "20261130-022518-rm-rf"
    plus_one = datetime(2026, 11, 30, 3, 25, 18, tzinfo=timezone(timedelta(hours=1)))
    assert new_run_id("x", now=plus_one) == "20261130-022518-x"
    long = new_run_id("Z" * 500, now=now)
    validate_run_id(long)
    assert long.startswith("20261130-022518-zzz")
    assert len(long) <= 64 - 7  # room left for a `-<n>` suffix of up to 6 digits
    assert re.fullmatch(r"\d{8}-\d{6}", new_run_id())


def test_next_run_id_sequence() -> None:
    run_id = "20261130-022518"
    seen = [run_id]
    for _ in range(5):
        run_id = next_run_id(run_id)
        seen.append(run_id)
    assert seen == [
        "20261130-022518",
        "20261130-022518-2",
        "20261130-022518-3",
        "20261130-022518-4",
        "20261130-022518-5",
        "20261130-022518-6",
    ]
    assert next_run_id("20261130-022518-my-run") == "20261130-022518-my-run-2"
    assert next_run_id("20261130-022518-my-run-2") == "20261130-022518-my-run-3"
    assert next_run_id("20261130-022518-9") == "20261130-022518-10"
    assert next_run_id("a-b-99999") == "a-b-100000"
    assert next_run_id("run-1") == "run-1-2"  # -1 is never a counter
    with pytest.raises(InvalidRunId):
        next_run_id("../x")


def test_next_run_id_of_a_long_id_fits() -> None:
    run_id = "20261130-022518-" + "z" * 48
    assert len(run_id) == 64
    following = next_run_id(run_id)
    assert len(following) <= 64
    assert following != run_id
    assert following.endswith("-2")
    assert next_run_id(following) != following


# --- paths -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "a",
        "output/checkpoint-120",
        "a/b/c",
        "sp ace",
        "quo'te",
        "new\nline",
        "$(touch PWNED)",
        "-leading",
        "...",
        "a/..b",
        "a./b",
        "ünï",
    ],
)
def test_safe_relpath_accepts(path: str) -> None:
    assert safe_relpath(path) == path


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/",
        "/etc/passwd",
        "..",
        ".",
        "../x",
        "a/..",
        "a/../b",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        "//a",
        "a\0b",
    ],
)
def test_safe_relpath_refuses(path: str) -> None:
    with pytest.raises(InvalidPath):
        safe_relpath(path)


def test_join_run_path() -> None:
    assert join_run_path("/w/r1", "snapshot.json") == "/w/r1/snapshot.json"
    assert join_run_path("/w/r1/", "output/x") == "/w/r1/output/x"
    assert join_run_path("/", "x") == "/x"
    with pytest.raises(InvalidPath):
        join_run_path("w/r1", "x")
    with pytest.raises(InvalidPath):
        join_run_path("/w/r1", "../x")
    assert issubclass(InvalidPath, SchemaError)


# --- job commands ----------------------------------------------------------------------


def test_job_command_accepts_valid_input() -> None:
    job = JobCommand(
        dir="/w/r $(x)",
        script="echo 'hi'",
        env={"RUNWARDEN_SNAPSHOT_REQUEST": "/w/r/snapshot.request", "_X1": "a\nb"},
        secrets={"HF_TOKEN": SecretStr("s3cr3t $(x) 'q'")},
    )
    assert job.secrets["HF_TOKEN"].get_secret_value() == "s3cr3t $(x) 'q'"
    assert "s3cr3t" not in repr(job)
    assert "s3cr3t" not in str(job)


@pytest.mark.parametrize(
    "name", ["", "1ABC", "A-B", "A B", "A=B", "A\nB", "é", "A$", "$(x)", "A\0"]
)
def test_job_command_refuses_bad_env_names(name: str) -> None:
    with pytest.raises(ValidationError, match="environment variable name"):
        JobCommand(dir="/w/r", script="true", env={name: "x"})
    with pytest.raises(ValidationError, match="environment variable name"):
        JobCommand(dir="/w/r", script="true", secrets={name: SecretStr("x")})


@pytest.mark.parametrize("value", ["hunter2\nmore", "hunter2\r", "\0hunter2", "a\r\nhunter2"])
def test_job_command_refuses_bad_secret_values_naming_the_variable(value: str) -> None:
    with pytest.raises(ValidationError) as raised:
        JobCommand(dir="/w/r", script="true", secrets={"HF_TOKEN": SecretStr(value)})
    messages = [error["msg"] for error in raised.value.errors(include_input=False)]
    assert messages == ["Value error, HF_TOKEN cannot be passed to the job"]
    assert all("hunter2" not in message for message in messages)
    assert "hunter2" not in str(raised.value)


def test_job_command_refuses_nul_in_env_values_and_scripts() -> None:
    with pytest.raises(ValidationError, match="NAME cannot hold a NUL byte"):
        JobCommand(dir="/w/r", script="true", env={"NAME": "a\0b"})
    with pytest.raises(ValidationError, match="NUL"):
        JobCommand(dir="/w/r", script="echo \0")
    with pytest.raises(ValidationError):
        JobCommand(dir="/w/r", script="")


@pytest.mark.parametrize("directory", ["relative", "", "./w", "~/w", "w/../r", "/w/r\0"])
def test_job_command_refuses_a_bad_dir(directory: str) -> None:
    with pytest.raises(ValidationError):
        JobCommand(dir=directory, script="true")


def test_job_command_forbids_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        JobCommand.model_validate({"dir": "/w", "script": "true", "argv": ["x"]})
