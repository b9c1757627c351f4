"""The event pipeline under faults (issue 4, "Faults" and "Two workers at once"): a
worker killed with SIGKILL at each point of a stop, a countdown delivered again after
the stop completed, two workers at once with duplicate messages, and bad input
through the producers' API.

Real redis-server (AOF), real Celery worker and beat processes, the toy trainer as
the job, the shortened clocks of bench/harness/pipeline.py (proof 6 s, end 4 s, reconcile
1 s).
"""

from __future__ import annotations

import base64
import re
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from producers.api import OperationFailed
from schemas import (
    InvalidRunId,
    NoSnapshots,
    NotFound,
    NotRunning,
    NotStarted,
    RunRecord,
    RunState,
    SnapshotReason,
    StopPhase,
    StopState,
    TargetConfig,
    UnknownTarget,
)
from schemas.events import (
    TASK_END_TIMEOUT,
    TASK_PROOF_TIMEOUT,
    TASK_SNAPSHOT_REQUEST,
    LaunchSpec,
)
from workers.executors import quote

from ...conftest import TOY_TRAINER, wait_for

pytestmark = pytest.mark.slow

SIGTERM_LOG = "sigterm.log"

# A toy trainer that, like a real training job, takes a while to end on SIGTERM: it
# notes every SIGTERM it gets in `sigterm.log` (in its run directory), then exits
# `grace` seconds after the first one. So a cancel takes `grace` seconds, and a
# second cancel issued meanwhile shows up as a second line.
SLOW_TERM = """\
import os, signal, sys, threading, time
sys.path.insert(0, {examples!r})
import toy_trainer

grace = float(sys.argv[1])
timers = []

def on_term(signum, frame):
    with open({log!r}, "a") as file:
        file.write(f"{{time.time():.3f}}\\n")
    if not timers:
        timers.append(threading.Timer(grace, os._exit, (143,)))
        timers[0].start()

signal.signal(signal.SIGTERM, on_term)
sys.exit(toy_trainer.main(sys.argv[2:]))
"""


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path, workers=2) as started:
        started.wait_worker("w1")
        started.wait_worker("w2")
        try:
            yield started
        finally:
            started.kill_jobs()


def launch(pipeline: Pipeline, *args: str, command: str | None = None) -> str:
    command = command or toy("--steps", "100000", "--step-time", "0.05", *args)
    return pipeline.api.launch(LaunchSpec(target="local", command=command), wait_s=60).id


def slow_term(pipeline: Pipeline, grace_s: float, *args: str) -> str:
    """The command of a toy trainer that ends `grace_s` seconds after a SIGTERM."""
    script = pipeline.tmp / "slow_term.py"
    if not script.exists():
        script.write_text(SLOW_TERM.format(examples=str(TOY_TRAINER.parent), log=SIGTERM_LOG))
    words = " ".join(quote(a) for a in ("--steps", "100000", "--step-time", "0.05", *args))
    return f"exec {quote(sys.executable)} -u {quote(str(script))} {grace_s:g} {words}"


def sigterms(pipeline: Pipeline, run_id: str) -> int:
    path = Path(pipeline.api.get_run(run_id).remote_dir) / SIGTERM_LOG
    return len(path.read_text().splitlines()) if path.exists() else 0


def outcome_lines(pipeline: Pipeline, run_id: str, *workers: str) -> list[str]:
    """The "run <id>: <state> (<message>)" lines the workers logged for `run_id`: a
    worker logs one when its transition changed the run's record."""
    pattern = re.compile(
        rf"run {re.escape(run_id)}: (?:succeeded|failed|cancelled|stopped) \(", re.MULTILINE
    )
    return [m.group(0) for w in workers for m in pattern.finditer(pipeline.worker_log(w))]


def deadlines_of(pipeline: Pipeline, run_id: str) -> list[str]:
    return [d.member for d in pipeline.api.store.stops.pending_deadlines() if d.run_id == run_id]


def snapshot_of_store(pipeline: Pipeline, run_id: str) -> tuple[object, ...]:
    """Everything a stop task could change for `run_id` (the retrieval of its
    artifacts goes on beside, and is left out)."""
    store = pipeline.api.store
    run = store.runs.get(run_id).model_copy(update={"artifacts": None})
    markers = {
        name: (Path(run.remote_dir) / name).stat().st_mtime_ns
        for name in ("cancelled", "cancelling", "exit_code", SIGTERM_LOG)
        if (Path(run.remote_dir) / name).exists()
    }
    return (
        run,
        store.stops.get(run_id),
        store.stops.history(run_id),
        deadlines_of(pipeline, run_id),
        [s.run_id for s in store.stops.in_progress()],
        markers,
    )


def assert_late_countdowns_change_nothing(pipeline: Pipeline, run_id: str, stop_id: str) -> None:
    """Delivers the stop's countdowns again, as a broker would redeliver them after
    the stop completed: each answers "stale" and nothing changes."""
    run_dir = Path(pipeline.api.get_run(run_id).remote_dir)
    # The follower may record the end a moment before the cancel writes its marker;
    # the stop is closed a moment after the run's record.
    wait_for((run_dir / "cancelled").exists, timeout_s=10)
    wait_for(lambda: pipeline.api.get_stop(run_id) is None, timeout_s=10)
    before = snapshot_of_store(pipeline, run_id)
    body = {"run_id": run_id, "stop_id": stop_id}
    results = [
        pipeline.send(name, body)
        for name in (TASK_PROOF_TIMEOUT, TASK_END_TIMEOUT, TASK_PROOF_TIMEOUT)
    ]
    assert [r.get(timeout=30) for r in results] == ["stale"] * 3
    assert snapshot_of_store(pipeline, run_id) == before


def reconcile_results(log: str) -> list[int]:
    """What each `runwarden.reconcile` task returned (deadlines acted on), in order."""
    return [
        int(n)
        for n in re.findall(r"Task runwarden\.reconcile\[[^\]]+\] succeeded in [^:]+: (\d+)", log)
    ]


def deadline_task_ids(log: str) -> set[str]:
    """The ids of the deadline tasks a worker received. Reconcile sends its own (new
    ids) for the deadlines it finds due; a countdown that died with its worker keeps
    the id it had there."""
    return set(re.findall(r"Task runwarden\.(?:proof|end)_timeout\[([^\]]+)\] received", log))


# --- 1 and 2: a worker killed with SIGKILL at each point of a stop -----------------


@pytest.mark.parametrize("moment", ["request_written", "proof_pending", "end_pending"])
def test_a_killed_worker_s_stop_is_completed_by_a_fresh_worker_on_time(
    pipeline: Pipeline, moment: str
) -> None:
    """kill -9 the worker (a) right after the request is written, (b) while the proof
    countdown is pending, (c) while the end countdown is pending. A fresh worker
    completes the stop with the right state, acting on the deadline within one
    reconcile period (+5 s) of its due time, long before the broker would redeliver
    the lost countdown (visibility timeout); the countdown delivered again then
    changes nothing."""
    settings = pipeline.api.settings
    hangs = moment == "end_pending"
    run_id = launch(pipeline, "--hang-after-proof" if hangs else "--ignore-requests")
    pipeline.wait_step(run_id, 2)
    run_dir = Path(pipeline.api.get_run(run_id).remote_dir)

    if moment == "request_written":
        # Published raw, so the kill lands while the task may still be running: the
        # request is on the target, the countdown maybe not scheduled yet.
        body = {"run_id": run_id, "reason": "cost", "asked_by": "test"}
        pipeline.send(TASK_SNAPSHOT_REQUEST, body)
        wait_for((run_dir / "snapshot.request").exists, timeout_s=20, interval_s=0.002)
        pipeline.kill_worker("w1")
        stop = pipeline.api.get_stop(run_id)  # opened before the request was written
    elif moment == "proof_pending":
        stop = pipeline.api.stop(run_id, reason=SnapshotReason.COST, asked_by="test")
        time.sleep(2.0)
        assert pipeline.api.get_stop(run_id) == stop  # the proof countdown is pending
        pipeline.kill_worker("w1")
    else:
        pipeline.api.stop(run_id, reason=SnapshotReason.COST, asked_by="test")
        stop = pipeline.wait_phase(run_id, StopPhase.WAITING_END, timeout_s=20)
        pipeline.kill_worker("w1")
    killed_at = time.time()

    assert stop is not None
    assert stop.phase is (StopPhase.WAITING_END if hangs else StopPhase.WAITING_PROOF)
    assert stop.reason is SnapshotReason.COST
    due_at = stop.end_deadline if hangs else stop.proof_deadline
    assert due_at is not None
    due = due_at.timestamp()
    assert deadlines_of(pipeline, run_id) == [
        f"{run_id}|{stop.stop_id}|{'end' if hangs else 'proof'}"
    ]

    pipeline.start_worker("w2")
    ready = pipeline.wait_worker("w2")
    run, seen = pipeline.wait_terminal(run_id, timeout_s=60)

    # The right final state.
    if hangs:
        assert run.state is RunState.STOPPED, run  # the proof wins over the cancel
        assert run.snapshot is not None
        assert run.snapshot.reason is SnapshotReason.COST
        assert (run_dir / run.snapshot.checkpoint).is_dir()
    else:
        assert run.state is RunState.CANCELLED, run
        assert run.snapshot is None
    # The job was cancelled (the follower may record that a moment before the cancel
    # writes its marker), and the stop closed (a moment after the run's record).
    wait_for((run_dir / "cancelled").exists, timeout_s=10)
    wait_for(lambda: pipeline.api.get_stop(run_id) is None, timeout_s=10)

    # Acted on at its deadline: not before it, and within one reconcile period
    # (+5 s, the cancel included) of it, or of the fresh worker being up when that
    # came later.
    limit = max(due, ready) + settings.reconcile_s + 5.0
    assert seen <= limit, (
        f"ended {seen - due:.1f} s after its deadline (worker up {ready - due:+.1f} s)\n"
        + pipeline.logs()
    )
    history = pipeline.api.store.stops.history(run_id)
    assert [h.stop_id for h in history] == [stop.stop_id]
    closed_at = history[0].closed_at
    assert closed_at is not None
    assert due - 0.5 <= closed_at.timestamp() <= limit
    # ... long before the broker would redeliver the countdown that died with w1.
    assert limit < killed_at + settings.visibility_timeout_s
    assert pipeline.api.get_stop(run_id) is None
    assert deadlines_of(pipeline, run_id) == []
    if moment != "request_written":
        # The countdown was held by w1: the fresh worker never got it, its
        # reconcile acted on the deadline.
        # (The task's result is logged a moment after the store was written.)
        wait_for(lambda: 1 in reconcile_results(pipeline.worker_log("w2")), timeout_s=10)
        held = deadline_task_ids(pipeline.worker_log("w1"))
        assert held, pipeline.worker_log("w1")
        assert not held & deadline_task_ids(pipeline.worker_log("w2"))

    # 2: the countdown firing late (a redelivery) changes nothing.
    assert_late_countdowns_change_nothing(pipeline, run_id, stop.stop_id)


def test_a_countdown_delivered_again_after_reconcile_did_its_work_changes_nothing(
    pipeline: Pipeline,
) -> None:
    """The proof countdown dies with its worker; reconcile on a fresh worker cancels
    the job; the same countdown then delivered again, once and concurrently, and the
    end countdown of the same stop, answer "stale" and change nothing."""
    run_id = launch(pipeline, "--ignore-requests")
    pipeline.wait_step(run_id, 2)
    stop = pipeline.api.stop(run_id, asked_by="test")
    time.sleep(1.0)
    pipeline.kill_worker("w1")
    pipeline.start_worker("w2", concurrency=3)
    pipeline.wait_worker("w2")
    run, _ = pipeline.wait_terminal(run_id, timeout_s=40)
    assert run.state is RunState.CANCELLED, run
    held = deadline_task_ids(pipeline.worker_log("w1"))
    assert held, pipeline.worker_log("w1")
    assert not held & deadline_task_ids(pipeline.worker_log("w2"))

    assert_late_countdowns_change_nothing(pipeline, run_id, stop.stop_id)
    # The same, with the duplicates running at once.
    before = snapshot_of_store(pipeline, run_id)
    body = {"run_id": run_id, "stop_id": stop.stop_id}
    results = [
        pipeline.send(TASK_PROOF_TIMEOUT, body) for _ in range(3)
    ]
    assert [r.get(timeout=30) for r in results] == ["stale"] * 3
    assert snapshot_of_store(pipeline, run_id) == before
    assert len(outcome_lines(pipeline, run_id, "w1", "w2")) == 1
    # The fresh worker serves a new stop as usual.
    other = launch(pipeline)
    pipeline.wait_step(other, 2)
    pipeline.api.stop(other)
    assert pipeline.wait_state(other).state is RunState.STOPPED


# --- 3: two workers at once, duplicate messages ----------------------------------------


def test_two_workers_and_duplicate_messages_give_each_effect_once(two_workers: Pipeline) -> None:
    """Two workers, stops of three runs at once (one stops normally, one ignores the
    request, one proves then hangs), each stop asked twice at once, the proof
    countdown of one delivered twice more at its due time, and a fourth run cancelled
    twice at once: every run has one outcome, one stop, one cancel at most."""
    pipeline = two_workers
    normal = launch(pipeline, command=slow_term(pipeline, 1.0))
    ignoring = launch(pipeline, command=slow_term(pipeline, 1.0, "--ignore-requests"))
    hanging = launch(pipeline, command=slow_term(pipeline, 1.0, "--hang-after-proof"))
    cancelled = launch(pipeline, command=slow_term(pipeline, 1.0))
    stopped_runs = [normal, ignoring, hanging]
    everything = [*stopped_runs, cancelled]
    for run_id in everything:
        pipeline.wait_step(run_id, 2)

    with ThreadPoolExecutor(max_workers=8) as pool:
        asked = [
            pool.submit(pipeline.api.stop, run_id, asked_by=f"test{i}")
            for run_id in stopped_runs
            for i in range(2)
        ]
        stops: dict[str, StopState] = {}
        for future in asked:
            stop = future.result()
            # Asked twice at once: one stop, the same for both callers.
            assert stops.setdefault(stop.run_id, stop).stop_id == stop.stop_id
    assert sorted(stops) == sorted(stopped_runs)
    # The proof countdown of `ignoring`, delivered twice more at its due time.
    body = {"run_id": ignoring, "stop_id": stops[ignoring].stop_id}
    duplicates = [
        pipeline.send(TASK_PROOF_TIMEOUT, body, eta=stops[ignoring].proof_deadline)
        for _ in range(2)
    ]

    # `cancelled` is cancelled twice at once.
    barrier = threading.Barrier(2)

    def cancel() -> RunRecord | Exception:
        barrier.wait()
        try:
            return pipeline.api.cancel(cancelled)
        except (NotRunning, OperationFailed) as error:
            return error

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(lambda _: cancel(), range(2)))
    records = [a for a in answers if isinstance(a, RunRecord)]
    assert records, answers
    assert all(r.state is RunState.CANCELLED for r in records), answers

    expected = {
        normal: RunState.STOPPED,
        ignoring: RunState.CANCELLED,
        hanging: RunState.STOPPED,
        cancelled: RunState.CANCELLED,
    }
    for run_id, state in expected.items():
        run = pipeline.wait_state(run_id, timeout_s=40)
        assert run.state is state, run
    assert [d.get(timeout=30) for d in duplicates]  # both ran
    time.sleep(2.0)  # anything still in flight (a late countdown, a tick) lands

    store = pipeline.api.store
    for run_id in stopped_runs:
        history = store.stops.history(run_id)
        assert [h.stop_id for h in history] == [stops[run_id].stop_id], history
        assert store.stops.get(run_id) is None
        assert deadlines_of(pipeline, run_id) == []
    assert store.stops.history(cancelled) == []
    assert store.stops.get(cancelled) is None
    for run_id, state in expected.items():
        assert store.runs.get(run_id).state is state
        # One outcome: the run's record changed to its end state once, by one worker.
        lines = outcome_lines(pipeline, run_id, "w1", "w2")
        assert lines == [f"run {run_id}: {state} ("], lines
    # One decision to cancel per stop that needed one (none for the normal stop).
    logs = pipeline.worker_log("w1") + pipeline.worker_log("w2")
    for run_id, count in [(normal, 0), (ignoring, 1), (hanging, 1)]:
        found = re.findall(rf"run {re.escape(run_id)}: [^\n]*cancelling", logs)
        assert len(found) == count, found
    # The jobs that had to be cancelled were; the one that stopped was never signalled.
    assert sigterms(pipeline, normal) == 0
    assert all(sigterms(pipeline, run_id) >= 1 for run_id in (ignoring, hanging, cancelled))


# --- 4: bad input through the producers' API ----------------------------------------


def test_bad_input_through_the_api_is_refused_and_disturbs_nothing(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = pipeline.api
    worker_pid = pipeline.workers["w1"].pid

    with pytest.raises(NotFound) as not_found:
        api.stop("no-such-run")
    assert not_found.value.run_id == "no-such-run"
    with pytest.raises(NotFound):
        api.cancel("no-such-run")
    for bad in ("../x", "a/b", "", "-rf", "X" * 100):
        with pytest.raises(InvalidRunId, match=r"invalid run id|a run id"):
            api.stop(bad)
        with pytest.raises(InvalidRunId):
            api.get_run(bad)
    with pytest.raises(UnknownTarget, match="nowhere"):
        api.launch(LaunchSpec(target="nowhere", command="true"))

    # A secret the target does not allow: refused, naming it and how to allow it.
    spec = LaunchSpec(
        target="local",
        command=toy("--steps", "10", "--step-time", "0.05"),
        secrets=("RW_FAULTS_TOKEN",),
    )
    runs_before = api.list_runs()
    with pytest.raises(OperationFailed, match=r"does not allow the secret\(s\) RW_FAULTS_TOKEN"):
        api.launch(spec, wait_s=30)
    assert api.list_runs() == runs_before  # nothing was claimed or started
    # Allowed, but the worker has no value for it: refused, naming where it belongs;
    # a value this producer holds is never sent anywhere.
    value = "s3cr3t-" + secrets.token_hex(12)
    monkeypatch.setenv("RUNWARDEN_SECRET_RW_FAULTS_TOKEN", value)  # the producer's own
    monkeypatch.setenv("RW_FAULTS_TOKEN", value)
    local = TargetConfig.model_validate(api.store.targets.get("local"))
    api.add_target(local.model_copy(update={"allow_secrets": ("RW_FAULTS_TOKEN",)}))
    with pytest.raises(OperationFailed, match="secret RW_FAULTS_TOKEN is not set in") as missing:
        api.launch(spec, wait_s=30)
    assert value not in str(missing.value)
    assert str(api.settings.secrets.path) in str(missing.value)
    assert api.list_runs() == runs_before
    # Logged: by the worker's pool process, which may write it just after the producer
    # has the task's answer.
    wait_for(lambda: "secret RW_FAULTS_TOKEN is not set" in pipeline.worker_log("w1"), 10)
    assert value not in pipeline.worker_log("w1")
    # Set, but on two lines: no job could receive it as it is. Refused before anything
    # is claimed, naming it, never its value, on one line of the worker's log.
    api.settings.secrets.ensure("RW_FAULTS_TOKEN", make=f"{value}\nsecond-line")
    try:
        with pytest.raises(OperationFailed, match="secret RW_FAULTS_TOKEN holds a line break"):
            api.launch(spec, wait_s=30)
        assert api.list_runs() == runs_before
        wait_for(lambda: "RW_FAULTS_TOKEN holds a line break" in pipeline.worker_log("w1"), 10)
        assert value not in pipeline.worker_log("w1")
        assert "second-line" not in pipeline.worker_log("w1")
    finally:
        api.settings.secrets.remove("RW_FAULTS_TOKEN")
    api.add_target(local)

    # Stop or cancel a run that already ended: NotRunning, with its state.
    ended = launch(pipeline)
    assert api.cancel(ended).state is RunState.CANCELLED
    with pytest.raises(NotRunning) as not_running:
        api.stop(ended)
    assert not_running.value.state == "cancelled"
    with pytest.raises(NotRunning):
        api.cancel(ended)
    assert api.store.stops.history(ended) == []
    # A run with no job yet: NotStarted; one whose job reads no requests: NoSnapshots.
    preparing = RunRecord(
        id="faults-preparing",
        target="local",
        created=api.get_run(ended).created,
        remote_dir=str(pipeline.workdir / "faults-preparing"),
        state=RunState.PREPARING,
        command="true",
    )
    assert api.store.runs.create(preparing)
    with pytest.raises(NotStarted):
        api.stop(preparing.id)
    no_snapshots = api.launch(
        LaunchSpec(
            target="local",
            command=toy("--steps", "100000", "--step-time", "0.05"),
            snapshots=False,
        ),
        wait_s=60,
    ).id
    with pytest.raises(NoSnapshots):
        api.stop(no_snapshots)
    assert api.get_stop(no_snapshots) is None
    api.cancel(no_snapshots)

    # Nothing was disturbed: the same worker process serves a normal stop.
    assert pipeline.workers["w1"].pid == worker_pid
    assert pipeline.workers["w1"].poll() is None
    run_id = launch(pipeline)
    pipeline.wait_step(run_id, 3)
    api.stop(run_id, asked_by="test")
    run = pipeline.wait_state(run_id, timeout_s=30)
    assert run.state is RunState.STOPPED, run
    assert run.snapshot is not None

    # The secret's value is nowhere: not in Redis (nor its AOF), not in a log, not in
    # a run directory.
    assert_nowhere(pipeline, value)


def assert_nowhere(pipeline: Pipeline, value: str) -> None:
    """`value` is in no key of Redis and no file of the test (the AOF, the logs, the
    run directories), not even base64-encoded as a broker message's body is."""
    needle = value.encode()
    client = pipeline.redis.client()
    try:
        for key in client.scan_iter(count=1000):
            assert not any(needle in item for item in redis_values(client, key)), key
    finally:
        client.close()
    for path in pipeline.tmp.rglob("*"):
        if not path.is_file():
            continue
        blob = path.read_bytes()
        assert needle not in blob, path
        for chunk in re.findall(rb"[A-Za-z0-9+/]{24,}={0,2}", blob):
            try:
                decoded = base64.b64decode(chunk + b"=" * (-len(chunk) % 4))
            except ValueError:
                continue
            assert needle not in decoded, path


def redis_values(client: Any, key: bytes) -> list[bytes]:
    """Every member, field and value of `key`, as bytes."""
    kind = client.type(key).decode()
    if kind == "none":  # gone since the scan listed it
        return []
    if kind == "string":
        return [client.get(key) or b""]
    if kind == "hash":
        return [k + b"=" + v for k, v in client.hgetall(key).items()]
    if kind in ("list", "zset"):
        return list(client.lrange(key, 0, -1) if kind == "list" else client.zrange(key, 0, -1))
    if kind == "set":
        return list(client.smembers(key))
    assert kind == "stream", (key, kind)
    return [repr(entry).encode() for entry in client.xrange(key)]
