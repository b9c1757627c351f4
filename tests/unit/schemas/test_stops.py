"""`schemas.stops`: the JSON of a stop and of a deadline (as the store keeps them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from schemas import Deadline, SnapshotReason, StopPhase, StopState

T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def test_deadline_member_round_trip() -> None:
    deadline = Deadline(run_id="r1", stop_id="abcdef0123456789", kind="end", due=T0)
    assert deadline.member == "r1|abcdef0123456789|end"
    assert Deadline.from_member(deadline.member, T0) == deadline
    assert Deadline.model_validate_json(deadline.model_dump_json()) == deadline


def test_stop_state_json_round_trip() -> None:
    stop = StopState(
        run_id="r1",
        stop_id="abcdef0123456789",
        phase=StopPhase.WAITING_END,
        reason=SnapshotReason.COST,
        asked_by="policy:cost",
        asked_at=datetime(2026, 1, 1, 12),  # naive: taken as UTC
        proof_deadline=T0,
        end_deadline=T0 + timedelta(minutes=10),
        note="proof at step 3",
    )
    assert stop.asked_at.tzinfo is UTC
    assert StopState.model_validate_json(stop.model_dump_json()) == stop
    with pytest.raises(ValueError, match="stop id"):
        StopState.model_validate({**stop.model_dump(), "stop_id": "a|b"})
