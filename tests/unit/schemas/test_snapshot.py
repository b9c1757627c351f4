"""`schemas.snapshot`: overbrainer's snapshot tests ported (its behaviour is described in
docs/protocol.md), the proof parser's edge cases and properties, the reasons, the
`Snapshot` shape shared with overbrainer's serde type, and when a proof counts as
written (`proof_moment`)."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas import (
    ProofInvalid,
    ProofNone,
    ProofSaved,
    Snapshot,
    SnapshotReason,
    expected_checkpoint,
    parse_proof,
)
from schemas.protocol import PROOF_LIMIT
from schemas.snapshot import proof_moment

U64_MAX = 2**64 - 1
LINE_COLUMN = re.compile(r"\(line \d+, column \d+\)")


def proof(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def saved(
    checkpoint: str, step: int, reason: SnapshotReason, time: float | None = None
) -> ProofSaved:
    return ProofSaved(
        snapshot=Snapshot(checkpoint=checkpoint, step=step, reason=reason), time=time
    )


# --- overbrainer's snapshot tests, ported -----------------------------------------


def test_a_proof_names_its_checkpoint_step_and_reason() -> None:
    got = parse_proof(
        b'{"checkpoint": "output/checkpoint-120", "step": 120, "time": 1.5, "reason": "cost"}'
    )
    assert got == saved("output/checkpoint-120", 120, SnapshotReason.COST, 1.5)
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
    assert [r.value for r in SnapshotReason] == [
        "requested",
        "deadline",
        "cost",
        "disk",
        "preempted",
    ]


# --- parse_proof edge cases -------------------------------------------------------


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


def test_extra_fields_are_ignored_and_only_a_finite_time_is_kept() -> None:
    content = proof(
        checkpoint="output/checkpoint-3",
        step=3,
        reason="disk",
        time="not even a number",
        extra={"nested": [1, 2, 3]},
        checkpoints=["/etc/passwd"],
    )
    assert parse_proof(content) == saved("output/checkpoint-3", 3, SnapshotReason.DISK)
    times: list[tuple[Any, float | None]] = [
        (1.5, 1.5), (None, None), (-1, -1.0), ("x", None), ([], None), ({}, None),
        (True, None), (10**400, None), (1764500000, 1764500000.0),
    ]  # fmt: skip
    for time, kept in times:
        content = proof(checkpoint="output/checkpoint-3", step=3, time=time)
        assert parse_proof(content) == saved(
            "output/checkpoint-3", 3, SnapshotReason.REQUESTED, kept
        ), time


def test_surrounding_whitespace_is_fine() -> None:
    content = b" \n\t" + proof(checkpoint="output/checkpoint-2", step=2) + b"\n\n"
    assert parse_proof(content) == saved("output/checkpoint-2", 2, SnapshotReason.REQUESTED)


def test_trailing_garbage_is_invalid() -> None:
    content = proof(checkpoint="output/checkpoint-2", step=2) + b" {}"
    assert isinstance(parse_proof(content), ProofInvalid)


# Regression (found by review, failed before its fix): JSON that overbrainer's serde_json refuses
# (NaN, Infinity, a repeated key, a lone surrogate) is an invalid proof, not a saved one.
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


# Regression (found by review, failed before its fix): a valid surrogate pair is not taken for a
# lone surrogate.
def test_a_valid_surrogate_pair_is_fine() -> None:
    raw = b'{"checkpoint": "output/checkpoint-1", "step": 1, "note": "\\ud83d\\ude00"}'
    assert isinstance(parse_proof(raw), ProofSaved)


def test_expected_checkpoint() -> None:
    assert expected_checkpoint(0) == "output/checkpoint-0"
    assert expected_checkpoint(120) == "output/checkpoint-120"


# --- the Snapshot shape, shared with overbrainer's serde type ---------------------


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


# --- properties -------------------------------------------------------------------


ASCII_WHITESPACE = frozenset(b" \t\n\r\x0c")
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
reasons = st.none() | st.sampled_from([r.value for r in SnapshotReason]) | st.text(max_size=12)
extras = st.dictionaries(
    st.text(max_size=10).filter(lambda k: k not in ("checkpoint", "step", "reason")),
    json_values,
    max_size=4,
)


@given(st.binary(max_size=600))
def test_parse_proof_never_raises(content: bytes) -> None:
    got = parse_proof(content)
    assert isinstance(got, ProofNone | ProofSaved | ProofInvalid)
    assert isinstance(got, ProofNone) == all(b in ASCII_WHITESPACE for b in content)


@given(st.lists(st.sampled_from(sorted(ASCII_WHITESPACE)), max_size=50).map(bytes))
def test_any_ascii_whitespace_is_no_proof(content: bytes) -> None:
    assert parse_proof(content) == ProofNone()


@given(st.text(alphabet='{}[]":,0123456789 \n-.tfnulrecktpos\\', max_size=80))
def test_parse_proof_on_json_looking_text(text: str) -> None:
    got = parse_proof(text.encode())
    assert isinstance(got, ProofNone | ProofSaved | ProofInvalid)
    if isinstance(got, ProofSaved):
        assert got.snapshot.checkpoint == expected_checkpoint(got.snapshot.step)


wrong_checkpoints = st.one_of(
    st.text(max_size=40),
    st.integers().map(lambda n: f"output/checkpoint-{n}"),
    st.integers(0, U64_MAX).map(lambda n: f"output/checkpoint-{n:03d}"),
    st.integers(0, 99).map(lambda n: f"./output/checkpoint-{n}"),
    st.integers(0, 99).map(lambda n: f"output/checkpoint-{n}/"),
    st.integers(0, 99).map(lambda n: f"/output/checkpoint-{n}"),
)


@given(st.integers(0, U64_MAX), wrong_checkpoints, reasons, extras, st.sampled_from([None, 2]))
def test_a_proof_naming_another_checkpoint_is_invalid(
    step: int, checkpoint: str, reason: str | None, extra: dict[str, Any], indent: int | None
) -> None:
    if checkpoint == expected_checkpoint(step):
        checkpoint += "x"
    written = extra | {"checkpoint": checkpoint, "step": step, "reason": reason}
    got = parse_proof(json.dumps(written, indent=indent).encode())
    assert isinstance(got, ProofInvalid)


@given(
    st.integers(0, U64_MAX),
    reasons,
    extras,
    st.tuples(st.sampled_from([None, 2]), st.booleans(), st.booleans()),
)
def test_a_valid_proof_is_saved(
    step: int,
    reason: str | None,
    extra: dict[str, Any],
    style: tuple[int | None, bool, bool],
) -> None:
    indent, ascii_only, omit_null = style
    written = extra | {"checkpoint": expected_checkpoint(step), "step": step}
    if reason is not None or not omit_null:
        written["reason"] = reason
    content = json.dumps(written, indent=indent, ensure_ascii=ascii_only).encode()
    got = parse_proof(content)
    assert isinstance(got, ProofSaved), got
    assert got.snapshot.step == step
    assert got.snapshot.checkpoint == expected_checkpoint(step)
    assert got.snapshot.reason is SnapshotReason.parse(reason)


@given(st.integers(0, U64_MAX), st.one_of(st.booleans(), st.floats(), st.text(max_size=5)))
def test_a_step_of_another_type_is_invalid(step: int, wrong: Any) -> None:
    content = json.dumps({"checkpoint": expected_checkpoint(step), "step": wrong})
    assert isinstance(parse_proof(content.encode()), ProofInvalid)


@given(st.integers(max_value=-1) | st.integers(min_value=2**64))
def test_a_step_out_of_u64_is_invalid(step: int) -> None:
    content = json.dumps({"checkpoint": expected_checkpoint(step), "step": step})
    assert isinstance(parse_proof(content.encode()), ProofInvalid)


# --- when a proof counts as written ---------------------------------------------------

ASKED = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
SEEN = ASKED + timedelta(seconds=40)


@pytest.mark.parametrize(
    ("written", "moment"),
    [
        (ASKED.timestamp() + 2.5, ASKED + timedelta(seconds=2.5)),  # its own time
        (ASKED.timestamp() - 3600, ASKED),  # before the request: the request
        (1.0, ASKED),  # a clock at the epoch
        (SEEN.timestamp() + 5, SEEN),  # after it was seen: when it was seen
        (None, SEEN),  # no time: when it was seen
        (math.nan, SEEN),
        (math.inf, SEEN),
        (-math.inf, SEEN),
        (1e300, SEEN),  # past any datetime: never overflows
        (-1e300, ASKED),
    ],
)
def test_a_proof_counts_from_its_time_bounded_by_the_request_and_its_sight(
    written: float | None, moment: datetime
) -> None:
    got = proof_moment(written, ASKED, SEEN)
    assert got == moment
    assert got.tzinfo is not None


def test_a_proof_seen_before_its_request_counts_from_the_request() -> None:
    # The workers' clocks disagree: the request's time is the earliest a proof counts.
    assert proof_moment(ASKED.timestamp(), ASKED, ASKED - timedelta(seconds=1)) == ASKED
    other_zone = SEEN.astimezone(timezone(timedelta(hours=5)))
    assert proof_moment(None, ASKED, other_zone) == SEEN
