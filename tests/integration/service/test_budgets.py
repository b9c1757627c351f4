"""Stop budgets end to end, with real redis-server, Celery worker and beat, real
detached toy jobs (`examples/toy_trainer.py`) and shortened clocks: a stop's proof
timeout learned from how long the run's saves took (a stop of its own, carried over
to a resumed run, or the periodic saves its metrics report), the run's own
`--proof-timeout` winning over everything, and the deadline policy asking early
enough for a run's saves. Each test prints what it measured (run with `-s`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from schemas import ArtifactsPhase, RunLimits, RunRecord, RunState, SnapshotReason, StopState
from schemas.budget import StopTimeouts, TimeoutSource
from schemas.events import LaunchSpec

pytestmark = pytest.mark.slow

BUDGET = {
    "RUNWARDEN_PROOF_TIMEOUT_FACTOR": "3",
    "RUNWARDEN_PROOF_TIMEOUT_MARGIN_S": "1",
    "RUNWARDEN_PROOF_TIMEOUT_FLOOR_S": "1",
    "RUNWARDEN_PROOF_TIMEOUT_CEILING_S": "600",
}
STEP = "0.05"


def launch(
    pipeline: Pipeline, *args: str, timeouts: StopTimeouts | None = None,
    limits: RunLimits | None = None,
) -> RunRecord:  # fmt: skip
    spec = LaunchSpec(
        target="local",
        # A name of its own in the run id: a job's processes carry their run id as a
        # mark, and a cancel sweeps the mark's processes, so a run id must not be one
        # a run of another test on this machine may have at the same second.
        name="budgets",
        command=toy("--steps", "100000", "--step-time", STEP, *args),
        timeouts=timeouts or StopTimeouts(),
        limits=limits or RunLimits(disk=False),
    )
    return pipeline.api.launch(spec, wait_s=60)


def wait_saves(pipeline: Pipeline, run_id: str, timeout_s: float = 60.0) -> float:
    """Waits until the store holds a save sample of `run_id`; returns the longest."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        saves = pipeline.api.store.budgets.saves(run_id)
        if saves:
            return max(s.seconds for s in saves)
        time.sleep(0.1)
    raise AssertionError(f"no save sample of {run_id}\n{pipeline.logs()}")


def stop_all(pipeline: Pipeline, run_ids: list[str]) -> dict[str, StopState]:
    """Asks each run for a snapshot, one after the other; its stop as opened."""
    return {r: pipeline.api.stop(r, SnapshotReason.REQUESTED, asked_by="test") for r in run_ids}


def ends(pipeline: Pipeline, run_ids: list[str], timeout_s: float = 90.0) -> dict[str, RunRecord]:
    """Waits until every run ended; each one's record."""
    deadline = time.monotonic() + timeout_s
    ended: dict[str, RunRecord] = {}
    while len(ended) < len(run_ids) and time.monotonic() < deadline:
        for run_id in run_ids:
            if run_id not in ended:
                run = pipeline.api.get_run(run_id)
                if run.state.is_terminal:
                    ended[run_id] = run
        time.sleep(0.05)
    missing = [r for r in run_ids if r not in ended]
    assert not missing, f"not ended: {missing}\n{pipeline.logs()}"
    return ended


def took(stop: StopState, run: RunRecord) -> float:
    """Seconds from the request (the stop's `asked_at`) to the recorded end."""
    assert run.ended is not None
    return (run.ended - stop.asked_at).total_seconds()


def resumable(pipeline: Pipeline, run_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        artifacts = pipeline.api.get_run(run_id).artifacts
        if artifacts is not None and artifacts.phase is ArtifactsPhase.DONE:
            return
        time.sleep(0.2)
    raise AssertionError(f"{run_id} not retrieved: {pipeline.api.get_run(run_id)}")


# --- a quick saver's deaf stop is cancelled in seconds ----------------------------


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[Pipeline]:
    """The default proof timeout 30 s; the deadline lead 1 s."""
    env = BUDGET | {"RUNWARDEN_PROOF_TIMEOUT_S": "30", "RUNWARDEN_DEADLINE_LEAD_S": "1"}
    with running_pipeline(tmp_path, extra_env=env) as started:
        yield started


def test_a_run_with_2_second_saves_gets_a_proof_timeout_of_seconds(quick: Pipeline) -> None:
    pipeline = quick
    # A run that saves in 2 s when asked: its stop is the sample, carried to its resume.
    source = launch(pipeline, "--save-time", "2")
    pipeline.wait_step(source.id, 2)
    [first] = stop_all(pipeline, [source.id]).values()
    assert first.budget is not None
    assert first.budget.source is TimeoutSource.DEFAULT
    stopped = pipeline.wait_state(source.id)
    assert stopped.state is RunState.STOPPED, stopped
    wait_saves(pipeline, source.id)  # pushed right after the end is recorded
    [sample] = pipeline.api.store.budgets.saves(source.id)
    assert sample.kind == "stop"
    assert 2.0 <= sample.seconds < 6, sample
    resumable(pipeline, source.id)
    spec = pipeline.api.resume_spec(
        source.id, command=toy("--steps", "100000", "--step-time", STEP, "--ignore-requests")
    )
    resumed = pipeline.api.launch(spec, wait_s=60)
    # A deaf run that reports its periodic 2 s saves; and a deaf run that never saved.
    periodic = launch(pipeline, "--save-every", "10", "--save-time", "2", "--ignore-requests")
    control = launch(pipeline, "--ignore-requests")
    periodic_sample = wait_saves(pipeline, periodic.id)
    assert 2.0 <= periodic_sample < 3, periodic_sample
    pipeline.wait_step(control.id, 2)
    runs = [resumed.id, periodic.id, control.id]
    opened = stop_all(pipeline, runs)
    ended = ends(pipeline, runs)
    budgets = {r: s.budget for r, s in opened.items()}
    assert all(b is not None for b in budgets.values())
    seconds = {r: took(opened[r], ended[r]) for r in runs}
    print(
        f"\nrequest to cancel of a deaf stop (default proof timeout 30 s):"
        f"\n  learned from its source's stop ({sample.seconds:.2f} s):"
        f" timeout {opened[resumed.id].budget.proof_timeout_s:.2f} s, cancelled after"  # type: ignore[union-attr]
        f" {seconds[resumed.id]:.2f} s"
        f"\n  learned from its periodic saves ({periodic_sample:.2f} s):"
        f" timeout {opened[periodic.id].budget.proof_timeout_s:.2f} s, cancelled after"  # type: ignore[union-attr]
        f" {seconds[periodic.id]:.2f} s"
        f"\n  nothing learned: timeout {opened[control.id].budget.proof_timeout_s:.2f} s,"  # type: ignore[union-attr]
        f" cancelled after {seconds[control.id]:.2f} s"
    )
    for run_id in runs:
        assert ended[run_id].state is RunState.CANCELLED, ended[run_id]
    for run_id, learned_from in ((resumed.id, sample.seconds), (periodic.id, periodic_sample)):
        budget = budgets[run_id]
        assert budget is not None
        assert budget.source is TimeoutSource.LEARNED
        assert budget.proof_timeout_s == pytest.approx(3 * learned_from + 1)
        # Cancelled at its learned deadline (plus the cancel), not the default's.
        assert budget.proof_timeout_s - 0.5 <= seconds[run_id] < budget.proof_timeout_s + 6
        assert seconds[run_id] < 20
    control_budget = budgets[control.id]
    assert control_budget is not None
    assert (control_budget.source, control_budget.proof_timeout_s) == ("default", 30)
    assert 29.5 <= seconds[control.id] < 40
    # The stop history says which timeout each stop used, and why; the log, what it did.
    [closed] = pipeline.api.store.stops.history(resumed.id)
    assert closed.budget == budgets[resumed.id]
    waited = round(closed.budget.proof_timeout_s, 1)
    note = f"run {resumed.id}: no snapshot {waited:g} s after it was asked for: cancelling"
    assert note in pipeline.worker_log("w1"), pipeline.logs()


def test_the_deadline_policy_asks_early_enough_for_the_runs_saves(quick: Pipeline) -> None:
    pipeline = quick
    hours = 30 / 3600  # the deadline 30 s after the start; the lead 1 s
    saver = launch(pipeline, "--save-every", "10", "--save-time", "2",
                   limits=RunLimits(max_hours=hours, disk=False))  # fmt: skip
    plain = launch(pipeline, limits=RunLimits(max_hours=hours, disk=False))
    longest = wait_saves(pipeline, saver.id)
    ended = ends(pipeline, [saver.id, plain.id], timeout_s=60)
    asked: dict[str, float] = {}
    for run_id in (saver.id, plain.id):
        run = ended[run_id]
        assert run.state is RunState.STOPPED, run
        assert run.snapshot is not None
        assert run.snapshot.reason is SnapshotReason.DEADLINE
        [stop] = pipeline.api.store.stops.history(run_id)
        assert run.started is not None
        asked[run_id] = (stop.asked_at - run.started).total_seconds()
    lead = 3 * longest
    print(f"\ndeadline asked {asked[saver.id]:.2f} s after the start of a run whose saves take"
          f" {longest:.2f} s (lead {lead:.2f} s), {asked[plain.id]:.2f} s for one without"
          " (lead 1 s); max_hours = 30 s")  # fmt: skip
    assert asked[saver.id] <= 30 - lead + 1.5  # a policy tick a second
    assert asked[plain.id] >= 30 - 1 - 0.5
    # The saver proved before its deadline.
    assert (ended[saver.id].ended - ended[saver.id].started).total_seconds() < 30  # type: ignore[operator]


# --- a slow saver is never cancelled once seen saving -------------------------------


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[Pipeline]:
    """The default proof timeout 3 s, shorter than the toy's 6 s saves."""
    with running_pipeline(tmp_path, extra_env=BUDGET | {"RUNWARDEN_PROOF_TIMEOUT_S": "3"}) as p:
        yield p


def test_a_run_with_saves_longer_than_the_default_is_not_cancelled_once_seen(
    slow: Pipeline,
) -> None:
    pipeline = slow
    saving = ("--step-time", "0.1", "--save-time", "6")
    learned = launch(pipeline, *saving, "--save-every", "50")
    never = launch(pipeline, *saving, "--save-every", "100000")
    short = launch(pipeline, *saving, "--save-every", "50",
                   timeouts=StopTimeouts(proof_timeout_s=2))  # fmt: skip
    long = launch(pipeline, *saving, "--save-every", "100000",
                  timeouts=StopTimeouts(proof_timeout_s=25))  # fmt: skip
    seen = wait_saves(pipeline, learned.id)
    wait_saves(pipeline, short.id)
    assert 6 <= seen < 7, seen
    for run in (never, long):
        pipeline.wait_step(run.id, 2)
    runs = [learned.id, never.id, short.id, long.id]
    opened = stop_all(pipeline, runs)
    ended = ends(pipeline, runs)
    seconds = {r: took(opened[r], ended[r]) for r in runs}
    names = {learned.id: "seen saving", never.id: "never seen saving",
             short.id: "seen saving, --proof-timeout 2", long.id: "--proof-timeout 25"}  # fmt: skip
    print("\nsaves of 6 s, default proof timeout 3 s:")
    for run_id in runs:
        budget = opened[run_id].budget
        assert budget is not None
        print(f"  {names[run_id]}: {budget.source} {budget.proof_timeout_s:.2f} s ->"
              f" {ended[run_id].state} after {seconds[run_id]:.2f} s")  # fmt: skip
    # Seen saving once: a learned timeout past its saves; it proved and stopped.
    budget = opened[learned.id].budget
    assert budget is not None
    assert budget.source is TimeoutSource.LEARNED
    assert budget.proof_timeout_s == pytest.approx(3 * seen + 1)
    assert ended[learned.id].state is RunState.STOPPED, ended[learned.id]
    # Never seen saving: the default 3 s, too short for its 6 s save: cancelled.
    assert (opened[never.id].budget.source, opened[never.id].budget.proof_timeout_s) == (  # type: ignore[union-attr]
        "default", 3
    )
    assert ended[never.id].state is RunState.CANCELLED, ended[never.id]
    assert 2.5 <= seconds[never.id] < 8
    # The run's own timeout wins: over what was learned (cancelled at 2 s) ...
    assert opened[short.id].budget.source is TimeoutSource.EXPLICIT  # type: ignore[union-attr]
    assert ended[short.id].state is RunState.CANCELLED, ended[short.id]
    assert 1.5 <= seconds[short.id] < 7
    # ... and over the default (stopped with its checkpoint).
    assert opened[long.id].budget.source is TimeoutSource.EXPLICIT  # type: ignore[union-attr]
    assert opened[long.id].budget.proof_timeout_s == 25  # type: ignore[union-attr]
    assert ended[long.id].state is RunState.STOPPED, ended[long.id]
    assert 6 <= seconds[long.id] < 25
