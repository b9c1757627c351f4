"""The exactly-once launch (`workers/launch.py`, `workers/reconcile.py`) over fakeredis and
a fake target (tests/unit/workers/launch_fakes.py): a launch delivered again finds its run and
goes on from there, a spawn that broke looks for its job before it records anything,
and `reconcile` settles a run whose launch's worker died. The same faults with real
processes: tests/integration/test_launch_once.py."""

from __future__ import annotations

import os
import re
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from schemas import JobStatus, RunRecord, RunState, StoreError, TargetConfig
from schemas.events import LaunchSpec
from schemas.protocol import CLAIM_FILE, MARK_ENV, PID_FILE, RUN_ID_ENV
from store.steps import end_run
from workers import launch as launching
from workers import reconcile
from workers.errors import LaunchError, NotAllowed
from workers.executors import CommandError, SshError
from workers.find_job import DIED_MESSAGE, PROTOCOL_FILES

from .launch_fakes import T0, FakeExecutor, Killed, fake_context

SPEC = LaunchSpec(target="local", command="train", name="once", key="k1")


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short waits: for a dead worker's lock, and for a job after a broken spawn."""
    monkeypatch.setattr(launching, "LAUNCH_WAIT_S", 2.0)
    monkeypatch.setattr(launching, "SPAWN_WINDOW_S", 0.3)


def dead_workers_lock(ctx: launching.Context, key: str = "k1", ttl_s: float = 0.3) -> None:
    """The lock a killed worker leaves behind: held until it lapses."""
    assert ctx.store.locks.lock(f"launch:{key}", "dead-worker", ttl_s)


def only_run(ctx: launching.Context) -> RunRecord:
    (run,) = ctx.store.runs.find()
    return run


def assert_running_with_one_job(ctx: launching.Context, ex: FakeExecutor) -> RunRecord:
    run = only_run(ctx)
    assert run.state is RunState.RUNNING, run
    assert len(ex.spawned) == 1
    assert run.job is not None
    assert run.job.pid == ex.pid_of(run.remote_dir)
    assert ctx.store.follow.runs("local") == [run.id]
    assert ctx.store.launches.preparing(T0 + timedelta(days=1)) == []
    assert ctx.store.launches.launch("k1") == run.id
    return run


# --- a launch, and the same launch again -------------------------------------------


def test_a_launch_maps_its_key_claims_for_it_and_follows(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)")
    for name in PROTOCOL_FILES:
        (tmp_path / name).write_text("999999\n")  # a copied run directory's marks
    ex = FakeExecutor()
    ctx = fake_context(ex)
    spec = SPEC.model_copy(update={"upload": tmp_path})
    record = launching.launch(ctx, spec, T0)
    assert record == assert_running_with_one_job(ctx, ex)
    assert ex.files[f"{record.remote_dir}/{CLAIM_FILE}"] == f"{record.id} k1\n".encode()
    assert ex.files[f"{record.remote_dir}/train.py"] == b"print(1)"
    assert ex.uploads[0] == (record.remote_dir, PROTOCOL_FILES)
    assert ex.pid_of(record.remote_dir) != 999999
    assert ctx.store.locks.lock("launch:k1", "next", 1.0)  # released


def test_each_run_has_a_mark_of_its_own_in_its_job_s_environment() -> None:
    """A run's processes carry its id and its own random mark (`RUNWARDEN_MARK`), which
    is what a cancel sweeps by: two runs never share one, whatever their ids."""
    ex = FakeExecutor()
    ctx = fake_context(ex)
    runs = [launching.launch(ctx, SPEC.model_copy(update={"key": k}), T0) for k in ("a", "b")]
    assert [job.env[RUN_ID_ENV] for job in ex.spawned] == [run.id for run in runs]
    marks = [job.env[MARK_ENV] for job in ex.spawned]
    assert marks == [run.mark for run in runs] == [run.job_mark for run in runs]
    assert len(set(marks)) == 2
    assert all(re.fullmatch(r"[0-9a-f]{32}", mark) for mark in marks)
    legacy = runs[0].model_copy(update={"mark": None})
    assert legacy.job_mark == legacy.id  # a run recorded before marks


def test_the_same_key_again_returns_its_run_and_starts_nothing() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    first = launching.launch(ctx, SPEC, T0)
    again = launching.launch(ctx, SPEC, T0 + timedelta(seconds=5))
    assert again == first
    end_run(ctx.store, first.id, RunState.CANCELLED)
    ended = launching.launch(ctx, SPEC, T0 + timedelta(hours=5))
    assert ended.id == first.id
    assert ended.state is RunState.CANCELLED
    assert len(ex.spawned) == 1
    assert len(ctx.store.runs.find()) == 1


def test_the_key_the_task_gives_wins_else_the_spec_s() -> None:
    """The task gives the key of the producer who signed it
    (`schemas.idempotency.owned_launch_key`); a caller without one launches under the
    spec's own key."""
    ex = FakeExecutor()
    ctx = fake_context(ex)
    one = launching.launch(ctx, SPEC, T0, "billing_k1")
    two = launching.launch(ctx, SPEC, T0 + timedelta(seconds=1), "billing_k1")
    assert one.id == two.id
    three = launching.launch(ctx, SPEC, T0 + timedelta(seconds=2))
    assert three.id != one.id  # the spec's own key, k1
    assert ctx.store.launches.launch("billing_k1") == one.id
    assert ctx.store.launches.launch("k1") == three.id
    assert len(ex.spawned) == 2


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        ({"command": "sleep 1"}, "command"),
        ({"name": "other"}, "name"),
        ({"command": "sleep 1", "name": "other"}, "command, name"),
    ],
)
def test_a_key_that_started_another_launch_is_refused_saying_what_differs(
    change: dict[str, str], differs: str
) -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    first = launching.launch(ctx, SPEC, T0, "billing_k1")
    with pytest.raises(
        LaunchError, match=rf"already started run {first.id} .*its {differs} differ"
    ):
        launching.launch(ctx, SPEC.model_copy(update=change), T0, "billing_k1")
    assert len(ex.spawned) == 1
    assert ctx.store.runs.get(first.id) == first  # nothing changed


# --- a worker killed at each point, the message delivered again ---------------------


@pytest.mark.usefixtures("fast")
@pytest.mark.parametrize("point", ["create", "upload", "before_job", "after_job", "record"])
def test_a_launch_delivered_again_after_a_kill_starts_one_job(
    point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    kills = {"n": 1}

    def kill() -> None:
        if kills["n"]:
            kills["n"] -= 1
            raise Killed

    if point == "create":
        real_claim = ex.claim

        def claim_then_die(dir: str, owner: str) -> bool:
            kill()
            return real_claim(dir, owner)

        monkeypatch.setattr(ex, "claim", claim_then_die)
    elif point == "upload":
        ex.on_upload = kill
    elif point == "before_job":
        ex.before_spawn = kill
    elif point == "after_job":
        ex.after_spawn = kill
    else:
        real_start = ctx.store.launches.start

        def start_then_die(run_id: str, job: object) -> object:
            kill()
            return real_start(run_id, job)  # type: ignore[arg-type]

        monkeypatch.setattr(ctx.store.launches, "start", start_then_die)

    with pytest.raises(Killed):
        launching.launch(ctx, SPEC, T0)
    first = only_run(ctx)
    assert first.state is RunState.PREPARING
    started = ex.pid_of(first.remote_dir)
    assert (started is not None) == (point in ("after_job", "record"))
    dead_workers_lock(ctx)

    record = launching.launch(ctx, SPEC, T0 + timedelta(minutes=1))
    assert record.id == first.id
    assert record == assert_running_with_one_job(ctx, ex)
    if started is not None:
        assert record.job is not None
        assert record.job.pid == started  # the first job, followed
    assert ex.cancelled == []


@pytest.mark.usefixtures("fast")
def test_a_duplicate_while_the_first_is_at_work_waits_then_returns_its_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launching, "LAUNCH_WAIT_S", 0.3)
    ex = FakeExecutor()
    ctx = fake_context(ex)
    uploading, go_on = threading.Event(), threading.Event()

    def slow_upload() -> None:
        uploading.set()
        assert go_on.wait(10)

    ex.on_upload = slow_upload
    results: list[RunRecord] = []
    first = threading.Thread(target=lambda: results.append(launching.launch(ctx, SPEC, T0)))
    first.start()
    assert uploading.wait(10)
    duplicate = launching.launch(ctx, SPEC, T0 + timedelta(seconds=1))
    assert duplicate.state is RunState.PREPARING
    go_on.set()
    first.join(10)
    assert results[0].id == duplicate.id
    assert_running_with_one_job(ctx, ex)


def test_a_duplicate_before_the_first_created_its_run_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launching, "LAUNCH_WAIT_S", 0.2)
    ctx = fake_context(FakeExecutor())
    assert ctx.store.locks.lock("launch:k1", "a-live-worker", 30.0)
    with pytest.raises(LaunchError, match="at work on another worker"):
        launching.launch(ctx, SPEC, T0)
    assert ctx.store.runs.find() == []


# --- a spawn that broke ---------------------------------------------------------------


@pytest.mark.usefixtures("fast")
@pytest.mark.parametrize(
    "error", [CommandError("run", "timed out after 120 s"), SshError("disconnected", "gone")]
)
def test_a_spawn_that_broke_after_its_job_started_follows_the_job(error: Exception) -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)

    def answer_lost() -> None:
        raise error

    ex.after_spawn = answer_lost
    record = launching.launch(ctx, SPEC, T0)
    assert record == assert_running_with_one_job(ctx, ex)
    assert record.message is None


@pytest.mark.usefixtures("fast")
def test_a_spawn_that_broke_before_a_job_started_is_failed_after_the_window() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)

    def timed_out() -> None:
        raise CommandError("run", "timed out after 120 s")

    ex.before_spawn = timed_out
    with pytest.raises(CommandError):
        launching.launch(ctx, SPEC, T0)
    run = only_run(ctx)
    assert run.state is RunState.FAILED
    assert run.message == "launch failed: run failed: timed out after 120 s"
    assert ex.spawned == []
    assert ex.calls.count("read") >= 2  # looked at once, and again at the window's end


@pytest.mark.usefixtures("fast")
def test_a_spawn_whose_target_stays_unreachable_is_left_for_reconcile() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex, launch_max_runtime_s=1.0, launch_grace_s=1.0)

    def cut() -> None:
        ex.unreachable = True
        raise SshError("disconnected", "the connection broke")

    ex.after_spawn = cut
    with pytest.raises(SshError, match="connection broke"):
        launching.launch(ctx, SPEC, T0)
    run = only_run(ctx)
    assert run.state is RunState.PREPARING
    later = T0 + timedelta(seconds=10)
    assert reconcile.settle_launches(ctx, later) == 0  # still unreachable: left
    assert only_run(ctx).state is RunState.PREPARING
    ex.unreachable = False
    assert reconcile.settle_launches(ctx, later) == 1
    assert_running_with_one_job(ctx, ex)


def test_a_launch_abandoned_in_the_spawn_cancels_the_job_it_started() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)

    class SoftTimeLimit(Exception):
        pass

    def out_of_time() -> None:
        raise SoftTimeLimit

    ex.after_spawn = out_of_time
    with pytest.raises(SoftTimeLimit):
        launching.launch(ctx, SPEC, T0)
    run = only_run(ctx)
    assert run.state is RunState.FAILED
    assert run.job is not None
    assert ex.cancelled == [run.job]
    assert run.message == f"launch failed: SoftTimeLimit; its job (pid {run.job.pid}) was cancelled"
    assert ctx.store.follow.runs("local") == []


def test_a_job_that_cannot_be_recorded_is_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)

    def down(run_id: str, job: object) -> object:
        raise StoreError("run store: cannot reach Redis")

    monkeypatch.setattr(ctx.store.launches, "start", down)
    with pytest.raises(StoreError):
        launching.launch(ctx, SPEC, T0)
    assert len(ex.cancelled) == 1
    assert only_run(ctx).state is RunState.PREPARING  # reconcile settles it later


# --- reconcile settles launches whose worker died -------------------------------------


def died(ctx: launching.Context, ex: FakeExecutor, point: str, key: str = "k1") -> RunRecord:
    """A launch of `key` whose worker was killed at `point`; returns its run."""

    def kill() -> None:
        raise Killed

    if point == "upload":
        ex.on_upload = kill
    else:
        ex.after_spawn = kill
    with pytest.raises(Killed):
        launching.launch(ctx, SPEC.model_copy(update={"key": key}), T0)
    ex.on_upload = ex.after_spawn = None
    return ctx.store.runs.get(ctx.store.launches.launch(key) or "")


def test_reconcile_follows_a_job_started_by_a_worker_that_died() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    run = died(ctx, ex, "spawn")
    due = T0 + timedelta(seconds=60 + 30 + 1)
    assert reconcile.settle_launches(ctx, due - timedelta(seconds=2)) == 0  # too young
    assert only_run(ctx).state is RunState.PREPARING
    assert reconcile.reconcile(ctx, due) == 0  # the one call in reconcile (no deadline)
    record = ctx.store.runs.get(run.id)
    assert record.state is RunState.RUNNING
    assert record.job is not None
    assert record.job.pid == ex.pid_of(run.remote_dir)
    assert ctx.store.follow.runs("local") == [run.id]
    assert reconcile.settle_launches(ctx, due) == 0  # settled once
    # The message delivered again much later: the run, as it is.
    assert launching.launch(ctx, SPEC, due) == record
    assert len(ex.spawned) == 1


def test_reconcile_fails_a_run_whose_worker_died_before_its_job() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    run = died(ctx, ex, "upload")
    assert reconcile.settle_launches(ctx, T0 + timedelta(minutes=2)) == 1
    record = ctx.store.runs.get(run.id)
    assert record.state is RunState.FAILED
    assert record.message == DIED_MESSAGE == "the worker died during the launch; no job started"
    assert record.job is None
    assert ctx.store.follow.runs("local") == []
    assert launching.launch(ctx, SPEC, T0 + timedelta(minutes=3)) == record
    assert ex.spawned == []


def test_reconcile_leaves_a_run_whose_launch_holds_its_lock() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    run = died(ctx, ex, "upload")
    assert ctx.store.locks.lock("launch:k1", "a-redelivered-launch", 30.0)
    assert reconcile.settle_launches(ctx, T0 + timedelta(hours=2)) == 0
    assert ctx.store.runs.get(run.id).state is RunState.PREPARING


def test_reconcile_trusts_no_job_pid_in_a_directory_claimed_by_another() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    run = died(ctx, ex, "spawn")
    ex.files[f"{run.remote_dir}/{CLAIM_FILE}"] = b"someone-else xyz\n"
    assert reconcile.settle_launches(ctx, T0 + timedelta(hours=2)) == 1
    assert ctx.store.runs.get(run.id).state is RunState.FAILED
    assert ctx.store.follow.runs("local") == []


def test_reconcile_settles_a_keyless_run_and_one_of_a_gone_target() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    keyless = RunRecord(id="old", target="local", created=T0, remote_dir="/w/old")
    gone = RunRecord(id="gone", target="elsewhere", created=T0, remote_dir="/x/gone")
    assert ctx.store.runs.create(keyless)
    assert ctx.store.runs.create(gone, key="kg")
    ex.files["/w/old/.claim"] = b"old 0123abcd\n"
    ex.files[f"/w/old/{PID_FILE}"] = b"4242\n"
    ex.statuses[4242] = JobStatus.exited(0)  # ended since: the watch records its end
    assert reconcile.settle_launches(ctx, T0 + timedelta(hours=2)) == 2
    old = ctx.store.runs.get("old")
    assert old.state is RunState.RUNNING
    assert old.job is not None
    assert old.job.pid == 4242
    assert ctx.store.follow.runs("local") == ["old"]
    failed = ctx.store.runs.get("gone")
    assert failed.state is RunState.FAILED
    assert failed.message == f"{DIED_MESSAGE} (its target 'elsewhere' no longer exists)"


def test_reconcile_tries_an_unreachable_target_once_per_pass() -> None:
    ex = FakeExecutor()
    ctx = fake_context(ex)
    died(ctx, ex, "upload", key="ka")
    died(ctx, ex, "upload", key="kb")
    ex.unreachable = True
    ex.calls.clear()
    assert reconcile.settle_launches(ctx, T0 + timedelta(hours=2)) == 0
    assert len(ex.calls) == 1
    assert {r.state for r in ctx.store.runs.find()} == {RunState.PREPARING}


def test_a_root_worker_runs_a_local_target_s_jobs_as_root_only_when_it_says_so() -> None:
    """As root (this test's process), a local target without `run_as` is refused before
    anything is claimed: its jobs would run as root without the operator having said
    it; `run_as: root` says it."""
    assert os.geteuid() == 0, "this test needs a worker that is root"
    ex = FakeExecutor()
    ctx = fake_context(ex)
    silent = TargetConfig(name="local", kind="local", workdir="/w", upload_roots=("/",))
    ctx.target = lambda name: silent  # type: ignore[method-assign]
    with pytest.raises(NotAllowed, match="would run its jobs as root"):
        launching.launch(ctx, SPEC, T0)
    assert ex.spawned == []
    assert ctx.store.runs.find() == []
    said = silent.model_copy(update={"run_as": "root"})
    ctx.target = lambda name: said  # type: ignore[method-assign]
    assert launching.launch(ctx, SPEC, T0).state is RunState.RUNNING
