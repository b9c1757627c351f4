"""Regression tests for bugs found by review: each failed before its fix."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas import (
    RUN_ID_MAX_LEN,
    InvalidRunId,
    JobCommand,
    JobId,
    JobStatus,
    ProofInvalid,
    ProofSaved,
    next_run_id,
    parse_proof,
    validate_run_id,
)
from workers.executors import LocalExecutor, ProtocolError
from workers.executors.digest import glob_match
from workers.executors.scripts import parse_statuses


def test_a_rejected_secret_value_never_appears_in_the_error() -> None:
    with pytest.raises(ValidationError) as raised:
        JobCommand(dir="/w/r", script="true", secrets={"HF_TOKEN": "hunter2\n"})  # type: ignore[dict-item]
    assert "hunter2" not in str(raised.value)
    assert "hunter2" not in raised.value.json()
    assert "HF_TOKEN" in str(raised.value)


@given(st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,63}", fullmatch=True))
def test_next_run_id_is_always_another_valid_id(run_id: str) -> None:
    try:
        validate_run_id(run_id)
    except InvalidRunId:
        return
    following = next_run_id(run_id)
    assert following != run_id
    assert validate_run_id(following) == following
    assert len(following) <= RUN_ID_MAX_LEN


def test_next_run_id_at_the_length_limit() -> None:
    for run_id in ("a" * 62 + "-2", "a" * 64, "a" * 61 + "-99"):
        seen = {run_id}
        current = run_id
        for _ in range(5):
            current = next_run_id(current)
            assert current not in seen
            seen.add(current)


@pytest.mark.parametrize(
    "raw", ['{"exited":"3"}', '{"exited":true}', '{"exited":3.0}', '{"exited":null}', '"exited"']
)
def test_job_status_is_as_strict_as_serde(raw: str) -> None:
    with pytest.raises(ValidationError):
        JobStatus.model_validate_json(raw)


def test_job_id_ignores_unknown_fields_like_serde() -> None:
    job = JobId.model_validate_json('{"dir":"/w/r1","pid":42,"container":null,"new":1}')
    assert job.pid == 42


@pytest.mark.parametrize(
    "raw",
    [
        b'{"checkpoint": "output/checkpoint-1", "step": 1, "time": NaN}',
        b'{"checkpoint": "output/checkpoint-1", "step": 1, "time": Infinity}',
        b'{"checkpoint": "output/checkpoint-1", "step": 1, "step": 1}',
        b'{"checkpoint": "output/checkpoint-1", "step": 1, "reason": "\\ud800"}',
        b'{"checkpoint": "output/checkpoint-1", "step": 1, "x": ["\\udfff"]}',
    ],
)
def test_proofs_serde_would_refuse_are_invalid(raw: bytes) -> None:
    assert isinstance(parse_proof(raw), ProofInvalid)


def test_a_valid_surrogate_pair_is_fine() -> None:
    raw = b'{"checkpoint": "output/checkpoint-1", "step": 1, "note": "\\ud83d\\ude00"}'
    assert isinstance(parse_proof(raw), ProofSaved)


def test_glob_match_has_no_catastrophic_backtracking() -> None:
    started = time.monotonic()
    assert not glob_match("*a" * 10 + "b", "a" * 40)
    assert not glob_match("*?" * 30 + "z", "y" * 200)
    # It took 9 s before; a generous bound that cannot flake on a loaded machine.
    assert time.monotonic() - started < 1.0


def test_one_garbage_exit_code_does_not_hide_the_other_statuses(tmp_path: Path) -> None:
    assert parse_statuses(b"running\nexited zz\nlost\n", 3)[0] == JobStatus.RUNNING
    results = parse_statuses(b"running\nexited zz\nlost\n", 3)
    assert isinstance(results[1], ProtocolError)
    assert results[2] == JobStatus.LOST

    executor = LocalExecutor(tmp_path)
    good, bad = tmp_path / "good", tmp_path / "bad"
    for run, code in ((good, "3\n"), (bad, "not a number\n")):
        run.mkdir()
        (run / "exit_code").write_text(code)
    jobs = [JobId(dir=str(good), pid=999_999), JobId(dir=str(bad), pid=999_998)]
    statuses = executor.statuses(jobs)
    assert statuses[0] == JobStatus.exited(3)
    assert isinstance(statuses[1], ProtocolError)
    with pytest.raises(ProtocolError, match="not a number"):
        executor.status(jobs[1])
