"""`schemas.ids`: run ids (validated, made, and the next one on a clash) and pids."""

from __future__ import annotations

import posixpath
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import (
    RUN_ID_MAX_LEN,
    InvalidRunId,
    SchemaError,
    check_pid,
    new_run_id,
    next_run_id,
    validate_run_id,
)

# --- run ids ----------------------------------------------------------------------


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
    stamp = r"20261130-022518-[a-z]{5}"
    assert re.fullmatch(stamp + "-my-run", new_run_id("My Run!", now=now))
    assert re.fullmatch(stamp, new_run_id("", now=now))
    assert re.fullmatch(stamp, new_run_id("ÄÖÜ", now=now))
    assert re.fullmatch(stamp + "-rm-rf", new_run_id("$(rm -rf /); ../..", now=now))
    plus_one = datetime(2026, 11, 30, 3, 25, 18, tzinfo=timezone(timedelta(hours=1)))
    assert re.fullmatch(stamp + "-x", new_run_id("x", now=plus_one))
    long = new_run_id("Z" * 500, now=now)
    validate_run_id(long)
    assert re.match(stamp + "-zzz", long)
    assert len(long) <= 64 - 7  # room left for a `-<n>` suffix of up to 6 digits
    assert re.fullmatch(r"\d{8}-\d{6}-[a-z]{5}", new_run_id())


def test_new_run_ids_of_one_second_differ() -> None:
    # Two services starting a run of the same name in the same second: a run's id is
    # its processes' mark, so the same id would let one's cancel sweep the other's job.
    now = datetime(2026, 11, 30, 2, 25, 18, tzinfo=UTC)
    ids = {new_run_id("toy", now=now) for _ in range(200)}
    assert len(ids) == 200


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


# Regression (found by review, failed before its fix): the next run id is always another valid id,
# whatever the id it follows.
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


# Regression (found by review, failed before its fix): at the length limit, the next run ids never
# repeat one another.
def test_next_run_id_at_the_length_limit() -> None:
    for run_id in ("a" * 62 + "-2", "a" * 64, "a" * 61 + "-99"):
        seen = {run_id}
        current = run_id
        for _ in range(5):
            current = next_run_id(current)
            assert current not in seen
            seen.add(current)


run_id_text = st.text(max_size=70) | st.text(alphabet="az09_.-/ A\n", max_size=70)


@given(run_id_text)
def test_validate_run_id_accepts_only_single_safe_components(text: str) -> None:
    try:
        got = validate_run_id(text)
    except InvalidRunId:
        return
    assert got == text
    assert posixpath.normpath(posixpath.join("/root", text)) == "/root/" + text
    assert "/" not in text
    assert not text.startswith(("-", "."))
    assert 1 <= len(text) <= 64
    assert text == text.strip()
    assert text.isascii()


# --- pids -------------------------------------------------------------------------


@pytest.mark.parametrize("pid", [0, 1, -1, 2**31])
def test_check_pid_refuses(pid: int) -> None:
    with pytest.raises(ValueError, match="invalid process id"):
        check_pid(pid)


def test_check_pid_refuses_non_integers() -> None:
    for pid in [True, "42", 42.0]:
        with pytest.raises(ValueError, match="integer"):
            check_pid(pid)  # type: ignore[arg-type]
