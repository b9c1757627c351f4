"""`schemas.chain`: what a preempted run's continuation is, and when a run's end
records one."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from schemas import Preemption, RunNotice, RunRecord, RunState, Snapshot, SnapshotReason
from schemas.chain import (
    ContinuationPhase,
    OnPreempt,
    candidate_targets,
    continuation_key,
    is_preempted,
)
from schemas.events import LaunchSpec
from schemas.idempotency import validate_launch_key
from schemas.run import lost_after_notice, transitioned

from ..conftest import record

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


def snap(reason: SnapshotReason) -> Snapshot:
    return Snapshot(checkpoint="output/checkpoint-7", step=7, reason=reason)


def test_only_a_preempted_snapshot_counts() -> None:
    assert is_preempted(snap(SnapshotReason.PREEMPTED))
    for reason in SnapshotReason:
        if reason is not SnapshotReason.PREEMPTED:
            assert not is_preempted(snap(reason)), reason
    assert not is_preempted(None)


def test_the_target_just_preempted_is_tried_last() -> None:
    plan = OnPreempt(targets=("a", "b", "c"))
    assert candidate_targets(plan, "a") == ["b", "c", "a"]
    assert candidate_targets(plan, "b") == ["a", "c", "b"]
    assert candidate_targets(plan, "z") == ["a", "b", "c"]
    assert candidate_targets(OnPreempt(), "here") == ["here"]


def test_a_plan_refuses_a_target_twice_and_bad_counts() -> None:
    with pytest.raises(ValidationError, match="twice"):
        OnPreempt(targets=("a", "a"))
    for bad in (0, -1, 10**6):
        with pytest.raises(ValidationError):
            OnPreempt(max_preemptions=bad)
    with pytest.raises(ValidationError):
        OnPreempt(targets=("not a name!",))


def test_a_launch_that_cannot_save_cannot_be_resumed_on_preemption() -> None:
    with pytest.raises(ValidationError, match="cannot save"):
        LaunchSpec(target="t", command="x", snapshots=False, on_preempt=OnPreempt())
    LaunchSpec(target="t", command="x", on_preempt=OnPreempt())


def test_the_continuation_key_is_a_launch_key_per_run() -> None:
    assert validate_launch_key(continuation_key("20261130-120000-a.b")) == (
        "continue.20261130-120000-a.b"
    )
    assert continuation_key("r1") != continuation_key("r2")


@pytest.mark.parametrize("state", [RunState.STOPPED, RunState.FAILED])
def test_a_run_with_a_plan_that_ends_preempted_waits_to_be_continued(state: RunState) -> None:
    run = record(
        state=RunState.RUNNING, on_preempt=OnPreempt(targets=("b",)), chain_preemptions=2
    )
    ended = transitioned(run, state, NOW, snapshot=snap(SnapshotReason.PREEMPTED))
    assert ended is not None
    assert ended.continuation is not None
    assert ended.continuation.phase is ContinuationPhase.WAITING
    assert ended.continuation.preemptions == 3
    assert ended.continuation.at == NOW
    assert ended.artifacts is not None  # and its retrieval, in the same change


@pytest.mark.parametrize(
    ("plan", "state", "reason"),
    [
        (None, RunState.STOPPED, SnapshotReason.PREEMPTED),  # no plan
        (OnPreempt(), RunState.STOPPED, SnapshotReason.REQUESTED),  # another reason
        (OnPreempt(), RunState.FAILED, None),  # a failure without a snapshot
        (OnPreempt(), RunState.CANCELLED, None),
        (OnPreempt(), RunState.SUCCEEDED, None),
    ],
)
def test_no_continuation_for_anything_else(
    plan: OnPreempt | None, state: RunState, reason: SnapshotReason | None
) -> None:
    run = record(state=RunState.RUNNING, on_preempt=plan)
    ended = transitioned(run, state, NOW, snapshot=None if reason is None else snap(reason))
    assert ended is not None
    assert ended.continuation is None


def test_the_snapshot_already_recorded_counts_too() -> None:
    run = record(
        state=RunState.RUNNING, on_preempt=OnPreempt(), snapshot=snap(SnapshotReason.PREEMPTED)
    )
    ended = transitioned(run, RunState.STOPPED, NOW)
    assert ended is not None
    assert ended.continuation is not None


# --- a run lost after a notice ---------------------------------------------------------


def lost_run(**changes: object) -> RunRecord:
    seen = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    notice = RunNotice(source="aws-spot", seen_at=seen, recorded_at=seen)
    base: dict[str, object] = {
        "state": RunState.FAILED,
        "preemption": Preemption(cloud="aws", notice=notice),
        "on_preempt": OnPreempt(targets=("a", "b")),
    }
    return record(**{**base, **changes})


def test_a_run_lost_after_a_notice_says_so_and_why_it_was_not_continued() -> None:
    assert lost_after_notice(lost_run()) == [
        ("lost", "after the aws-spot notice seen 2026-03-04 05:06:07 UTC: the run ended"
                 " failed before its job proved the preempted snapshot"),
        ("continued", "no: a run lost after a notice has no verified checkpoint of its own;"
                      " its chain has no earlier one: launch it again"),
    ]  # fmt: skip
    resumed = lost_after_notice(lost_run(state=RunState.CANCELLED, resumed_from="r0"))
    assert "the run ended cancelled before its job proved" in resumed[0][1]
    assert resumed[1][1].endswith("resume its chain's last one by hand: runwarden resume r0")
    plain = lost_after_notice(lost_run(on_preempt=None))
    assert [label for label, _ in plain] == ["lost"]


@pytest.mark.parametrize(
    "changes",
    [
        {"state": RunState.RUNNING},
        {"state": RunState.SUCCEEDED},
        {"state": RunState.STOPPED, "snapshot": snap(SnapshotReason.PREEMPTED)},
        {"state": RunState.FAILED, "snapshot": snap(SnapshotReason.PREEMPTED)},
        {"preemption": None},
    ],
    ids=["running", "succeeded", "saved", "saved-then-died", "no-watch"],
)
def test_a_run_not_lost_after_a_notice_says_nothing(changes: dict[str, object]) -> None:
    assert lost_after_notice(lost_run(**changes)) == []
