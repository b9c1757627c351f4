"""`workers.budgets` at work in the stops, the end of a run and the policies: each
stop gets the run's own timeouts, else learned ones, else the configured ones, and
keeps them; a stop that proved leaves its save time; a countdown too long for the
broker is left to `reconcile`; the policies ask early enough for the saves."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from schemas import (
    JobStatus,
    ProofSaved,
    RunLimits,
    RunRecord,
    RunState,
    Snapshot,
    SnapshotReason,
    StopPhase,
)
from schemas.budget import SaveSample, StopTimeouts, TimeoutSource
from schemas.events import (
    TASK_END_TIMEOUT,
    TASK_PROOF_TIMEOUT,
    TASK_SNAPSHOT_REQUEST,
    LaunchSpec,
)
from store import RunStore
from workers import budgets, cancels, policies, reconcile, stops
from workers import launch as launching
from workers.context import Context
from workers.executors import FollowUpdate
from workers.finish import finish
from workers.watch import observe_notices

from .conftest import Sent, policy_worker, running_run
from .launch_fakes import T0, FakeExecutor, fake_context

CLOCKS: dict[str, Any] = {
    "proof_timeout_s": 1800,
    "end_timeout_s": 600,
    "proof_timeout_factor": 3,
    "proof_timeout_margin_s": 1,
    "proof_timeout_floor_s": 2,
    "proof_timeout_ceiling_s": 7200,
}


def worker(tmp_path: Path, **settings: Any) -> tuple[Context, RunStore, Sent]:
    return policy_worker(tmp_path, **(CLOCKS | settings))


def learn(store: RunStore, run_id: str, *seconds: float) -> None:
    for s in seconds:
        store.budgets.record_save(run_id, SaveSample(kind="save", seconds=s, at=datetime.now(UTC)))


def countdowns(sent: Sent, task: str) -> list[float]:
    return [c for n, _, c in sent.calls if n == task]


def proved(run_dir: Path, step: int = 3) -> None:
    """The job's side of a stop: its checkpoint, then its proof."""
    (run_dir / "output" / f"checkpoint-{step}").mkdir(parents=True)
    (run_dir / "output" / f"checkpoint-{step}" / "weights.bin").write_bytes(b"w")
    proof = {"checkpoint": f"output/checkpoint-{step}", "step": step, "time": 1.0,
             "reason": "requested"}  # fmt: skip
    (run_dir / "snapshot.json").write_text(json.dumps(proof))


# --- which timeout a stop gets --------------------------------------------------------


def test_a_stop_with_nothing_learned_gets_the_configured_timeouts(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path)
    running_run(store, tmp_path, "r1")
    now = datetime.now(UTC)
    stop = stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", now)
    assert stop.budget is not None
    assert (stop.budget.source, stop.budget.proof_timeout_s) == (TimeoutSource.DEFAULT, 1800)
    assert stop.proof_deadline - stop.asked_at == timedelta(seconds=1800)
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == [1800]


def test_a_stop_of_a_run_with_2_second_saves_gets_seconds(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path)
    running_run(store, tmp_path, "r1")
    learn(store, "r1", 1.5, 2.0, 1.8)
    stop = stops.request_snapshot(ctx, "r1", SnapshotReason.COST, "cli", datetime.now(UTC))
    assert stop.budget is not None
    assert stop.budget.source is TimeoutSource.LEARNED
    assert stop.budget.proof_timeout_s == 3 * 2.0 + 1
    assert stop.proof_deadline - stop.asked_at == timedelta(seconds=7)
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == [7]
    assert store.stops.get("r1") == stop


def test_the_runs_own_timeouts_win(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path)
    own = StopTimeouts(proof_timeout_s=30, end_timeout_s=5)
    running_run(store, tmp_path, "r1", timeouts=own)
    learn(store, "r1", 100)  # learned would be 301 s
    stop = stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", datetime.now(UTC))
    assert stop.budget is not None
    assert (stop.budget.source, stop.budget.proof_timeout_s) == (TimeoutSource.EXPLICIT, 30)
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == [30]
    # Its proof seen at the deadline, the job still running: the run's end timeout.
    proof = ProofSaved(snapshot=Snapshot(checkpoint="output/checkpoint-3", step=3,
                                         reason=SnapshotReason.REQUESTED))  # fmt: skip
    run = store.runs.get("r1")
    assert cancels._proof_deadline(ctx, stop, run, proof, stop.proof_deadline) == "proved"
    moved = store.stops.get("r1")
    assert moved is not None
    assert moved.phase is StopPhase.WAITING_END
    assert moved.end_deadline == stop.proof_deadline + timedelta(seconds=5)
    assert countdowns(sent, TASK_END_TIMEOUT) == [5]


def test_a_request_found_in_the_run_directory_gets_the_learned_timeout(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path)
    run = running_run(store, tmp_path, "r1")
    learn(store, "r1", 4)
    stops.notice_request(ctx, run, "deadline", datetime.now(UTC))
    stop = store.stops.get("r1")
    assert stop is not None
    assert stop.asked_by == budgets.FOUND_BY
    assert stop.budget is not None
    assert (stop.budget.source, stop.budget.proof_timeout_s) == (TimeoutSource.LEARNED, 13)
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == [13]


def test_a_cancel_says_the_timeout_the_stop_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, store, _ = worker(tmp_path)
    run = running_run(store, tmp_path, "r1")
    learn(store, "r1", 2.5)
    stop = stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", datetime.now(UTC))
    notes: list[str] = []
    # The cancel itself is not run: the job here is this very process.
    monkeypatch.setattr(cancels, "_escalate", lambda ctx, stop, note, now: notes.append(note) or "")
    cancels._proof_deadline(ctx, stop, run, None, stop.proof_deadline)
    assert notes == ["no readable snapshot 8.5 s after it was asked for: cancelling the job"]


def test_a_countdown_longer_than_the_broker_keeps_a_message_is_left_to_reconcile(
    tmp_path: Path,
) -> None:
    ctx, store, sent = worker(tmp_path)
    limit = budgets.countdown_limit_s(ctx.settings)
    assert limit >= ctx.settings.proof_timeout_s  # the configured ones always fit
    assert limit + ctx.settings.task_max_runtime_s < ctx.settings.visibility_timeout_s
    running_run(store, tmp_path, "r1", timeouts=StopTimeouts(proof_timeout_s=limit + 1))
    now = datetime.now(UTC)
    stop = stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", now)
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == []
    [deadline] = store.stops.pending_deadlines()
    assert (deadline.stop_id, deadline.due) == (stop.stop_id, stop.proof_deadline)
    # reconcile fires it when it is due.
    assert reconcile.reconcile(ctx, stop.proof_deadline + timedelta(seconds=1)) == 1
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == [0.0]


def test_a_deadline_beyond_the_horizon_waits_in_the_table_and_reconcile_arms_it_once(
    tmp_path: Path,
) -> None:
    """A stop whose proof deadline is further than the countdown horizon sends no
    countdown (a worker would hold it in memory for the whole timeout); the first
    sweep within the horizon sends it with the time left, the next sweeps do not again;
    a countdown lost on the way is fired as overdue by the first sweep past its time."""
    ctx, store, sent = worker(tmp_path, countdown_horizon_s=60, reconcile_s=10)
    assert budgets.countdown_horizon_s(ctx.settings) == 60
    running_run(store, tmp_path, "r1", timeouts=StopTimeouts(proof_timeout_s=600))
    running_run(store, tmp_path, "r2", timeouts=StopTimeouts(proof_timeout_s=45))
    now = datetime.now(UTC)
    far = stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", now)
    stops.request_snapshot(ctx, "r2", SnapshotReason.REQUESTED, "cli", now)
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == [45]  # r2's only: within the horizon
    assert reconcile.arm_deadlines(ctx, now) == 0  # r2's was sent; r1's is far off
    sent.calls.clear()
    # 550 s later r1's deadline is 50 s away: armed once, with the time left (and
    # r2's, overdue by then, its countdown never having run, fired as overdue).
    later = now + timedelta(seconds=550)
    assert reconcile.reconcile(ctx, later) == 1
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == [0.0, 50]
    assert [b["run_id"] for b in sent.named(TASK_PROOF_TIMEOUT)] == ["r2", "r1"]
    assert reconcile.reconcile(ctx, later + timedelta(seconds=10)) == 0
    assert len(sent.named(TASK_PROOF_TIMEOUT)) == 2
    # Its countdown lost, the deadline is still pending past its time: the first sweep
    # after it fires it as overdue (the mark is no lease: not a second later than before).
    due = far.proof_deadline
    assert reconcile.reconcile(ctx, due - timedelta(seconds=1)) == 0
    assert reconcile.reconcile(ctx, due + timedelta(seconds=1)) == 1
    assert countdowns(sent, TASK_PROOF_TIMEOUT) == [0.0, 50, 0.0]


def test_the_horizon_is_never_shorter_than_three_sweeps_nor_past_the_broker_s_limit(
    tmp_path: Path,
) -> None:
    ctx, _, _ = worker(tmp_path, countdown_horizon_s=5, reconcile_s=10)
    assert budgets.countdown_horizon_s(ctx.settings) == 30
    ctx, _, _ = worker(tmp_path, countdown_horizon_s=10**7)
    assert budgets.countdown_horizon_s(ctx.settings) == budgets.countdown_limit_s(ctx.settings)


# --- what a stop leaves -------------------------------------------------------------


def test_a_stop_that_proved_leaves_its_request_to_proof_time(tmp_path: Path) -> None:
    ctx, store, _ = worker(tmp_path)
    run = running_run(store, tmp_path, "r1")
    asked = datetime.now(UTC) - timedelta(seconds=4)
    stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", asked)
    proved(tmp_path / "r1")
    record = finish(ctx, run, JobStatus.exited(0), ctx.executor("local"))
    assert record.state is RunState.STOPPED
    [sample] = store.budgets.saves("r1")
    assert sample.kind == "stop"
    assert 4 <= sample.seconds < 10
    # The same end recorded again (another worker) leaves no second sample.
    finish(ctx, run, JobStatus.exited(0), ctx.executor("local"))
    assert len(store.budgets.saves("r1")) == 1
    # The next run resumed from it starts with that sample.
    resumed = running_run(store, tmp_path, "r2", resumed_from="r1")
    budget = budgets.next_budget(ctx, resumed)
    assert budget.source is TimeoutSource.LEARNED
    assert budget.proof_timeout_s == pytest.approx(3 * sample.seconds + 1)


@pytest.mark.parametrize("case", ["no proof", "found", "proof at the deadline", "no stop"])
def test_a_stop_that_says_nothing_of_the_save_time_leaves_no_sample(
    tmp_path: Path, case: str
) -> None:
    ctx, store, _ = worker(tmp_path)
    run = running_run(store, tmp_path, "r1")
    now = datetime.now(UTC)
    if case == "found":
        stops.notice_request(ctx, run, "requested", now)  # its request's time is unknown
    elif case != "no stop":
        stop = stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", now)
        if case == "proof at the deadline":
            store.stops.advance("r1", stop.stop_id, StopPhase.WAITING_PROOF,
                               StopPhase.WAITING_END, end_deadline=now)  # fmt: skip
    if case != "no proof":
        proved(tmp_path / "r1")
    finish(ctx, run, JobStatus.exited(0), ctx.executor("local"))
    assert store.budgets.saves("r1") == []


def notice_tick(ctx: Context, run: RunRecord, seen: float | None, at: datetime) -> None:
    """A follow tick at `at` that reads the watcher's notice, seen at `seen` (Unix
    seconds by the target's clock), and its `preempted` request."""
    body = {"source": "aws-spot", "seen_at": seen, "not_after": None, "detail": "terminate"}
    update = FollowUpdate(
        status=JobStatus.RUNNING, request="preempted", notice=json.dumps(body).encode()
    )
    observe_notices(ctx, run, update, at)


@pytest.mark.parametrize(
    ("seen_ago_s", "learned"),
    [(6.0, (6, 9)), (-30.0, (2, 5)), (3600.0, (12, 15)), (None, None)],
    ids=["seen-6-s-before", "target-clock-ahead", "target-clock-behind", "clock-unread"],
)
def test_a_stop_opened_by_a_notice_leaves_its_save_time_from_the_notice(
    tmp_path: Path, seen_ago_s: float | None, learned: tuple[float, float] | None
) -> None:
    ctx, store, _ = worker(tmp_path)
    now = datetime.now(UTC)
    run = running_run(store, tmp_path, "r1")
    seen = None if seen_ago_s is None else (now - timedelta(seconds=seen_ago_s)).timestamp()
    notice_tick(ctx, run, seen, now - timedelta(seconds=2))  # the tick that saw it
    stop = store.stops.get("r1")
    assert stop is not None
    assert stop.asked_by == "notice:aws-spot"
    proved(tmp_path / "r1")
    (tmp_path / "r1" / "output" / "checkpoint-3" / "weights").write_bytes(b"w")
    finish(ctx, run, JobStatus.exited(0), ctx.executor("local"))
    if learned is None:
        assert store.budgets.saves("r1") == []  # the request's time is unknown
        return
    [sample] = store.budgets.saves("r1")
    assert sample.kind == "stop"
    # From the notice; a target clock ahead counts from when a worker saw it (2 s
    # ago), one behind from a follow period (5 s) plus 5 s before that at the earliest.
    assert learned[0] <= sample.seconds < learned[1]


# --- the policies -------------------------------------------------------------------


def test_the_deadline_policy_asks_earlier_for_a_run_with_slow_saves(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path, deadline_lead_s=15 * 60)
    started = datetime.now(UTC) - timedelta(minutes=40)
    running_run(store, tmp_path, "slow", started=started,
                limits=RunLimits(max_hours=1, disk=False))  # fmt: skip
    running_run(store, tmp_path, "quick", started=started,
                limits=RunLimits(max_hours=1, disk=False))  # fmt: skip
    learn(store, "slow", 400)  # 3 x 400 s = 20 min before the deadline: due now
    learn(store, "quick", 2)  # 6 s: the 15 min lead applies, due in 5 min
    assert policies.policy_target(ctx, "local", datetime.now(UTC)) == {"runs": 2, "asked": 1}
    [body] = sent.named(TASK_SNAPSHOT_REQUEST)
    assert (body["run_id"], body["reason"]) == ("slow", "deadline")


def test_the_cost_policy_asks_before_the_saves_outlast_the_cap(tmp_path: Path) -> None:
    ctx, store, sent = worker(tmp_path, cost_fraction=0.95)
    started = datetime.now(UTC) - timedelta(minutes=50)
    limits = RunLimits(max_cost_usd=10, usd_per_hour=10, disk=False)  # 1 h of budget
    running_run(store, tmp_path, "slow", started=started, limits=limits)
    running_run(store, tmp_path, "quick", started=started, limits=limits)
    learn(store, "slow", 250)  # 12.5 min: more than the 10 min left
    learn(store, "quick", 10)
    assert policies.policy_target(ctx, "local", datetime.now(UTC)) == {"runs": 2, "asked": 1}
    [body] = sent.named(TASK_SNAPSHOT_REQUEST)
    assert (body["run_id"], body["reason"]) == ("slow", "cost")


def test_a_run_without_limits_reads_no_samples(tmp_path: Path) -> None:
    ctx, store, _ = worker(tmp_path)
    run = running_run(store, tmp_path, "r1")
    learn(store, "r1", 400)
    assert budgets.policy_save_lead_s(ctx, run) == 0
    limited = running_run(store, tmp_path, "r2", limits=RunLimits(max_hours=3))
    learn(store, "r2", 400)
    assert budgets.policy_save_lead_s(ctx, limited) == 1200


# --- the run's own timeouts, from its launch ----------------------------------------


def test_a_launch_keeps_the_runs_own_timeouts() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    own = StopTimeouts(proof_timeout_s=30, end_timeout_s=5)
    spec = LaunchSpec(target="local", command="train", key="k9", timeouts=own)
    record = launching.launch(ctx, spec, T0)
    assert record.timeouts == own
    assert ctx.store.runs.get(record.id).timeouts == own
    plain = launching.launch(ctx, LaunchSpec(target="local", command="train", key="k8"), T0)
    assert plain.timeouts == StopTimeouts()
