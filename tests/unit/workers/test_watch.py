"""`workers.watch`: a follow tick over a real run directory of a local target, over
fakeredis. A dead job's `exit_code` is its end, except while a cancel of its run is
under way: the job may have forged it before the kill, and the cancel records the
end from its own reading once its `cancelled` marker is written (and a dead group
under a cancel's `cancelling` marker is left to that cancel too: its sweep may still
be ending an escaped process). A tick sees the
proof of a stop that waits for it (the end deadline from the proof's own time, once,
whoever races it), and never one whose checkpoint is a link."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from schemas import (
    JobId,
    JobStatus,
    ProofInvalid,
    ProofSaved,
    RunState,
    SnapshotReason,
    StopPhase,
    StoreError,
)
from schemas.events import TASK_END_TIMEOUT
from schemas.ledger import ProofSeen
from schemas.protocol import new_mark
from workers import cancels, stops
from workers import finish as finishing
from workers import watch as watching
from workers.cancel_mark import CANCEL_RETRY_S, cancel_key
from workers.finish import finish
from workers.watch import watch_target

from .conftest import policy_worker, running_run


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


@pytest.mark.parametrize("left", ["exit_code", "cancelling"])
@pytest.mark.parametrize("cancelling", [False, True])
def test_an_end_during_a_cancel_is_left_to_the_cancel(
    tmp_path: Path, cancelling: bool, left: str
) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=dead_pid()))
    (tmp_path / "r1" / left).write_text("0\n")
    if cancelling:
        assert store.locks.once(cancel_key(run.id), ttl_s=CANCEL_RETRY_S)
    found = watch_target(ctx, "local", datetime.now(UTC))
    after = store.runs.get(run.id)
    if cancelling:
        assert found["ended"] == 0
        assert after.state is RunState.RUNNING
        assert store.follow.runs("local") == [run.id]
        # The cancel's own reading: `cancelled` wins over any `exit_code`.
        (tmp_path / "r1" / "cancelled").touch()
        store.locks.forget(cancel_key(run.id))
        watch_target(ctx, "local", datetime.now(UTC))
        assert store.runs.get(run.id).state is RunState.CANCELLED
    else:
        assert found["ended"] == 1
        assert after.state is (RunState.SUCCEEDED if left == "exit_code" else RunState.CANCELLED)


@pytest.mark.parametrize("held", ["cgroup", "mark", "neither"])
@pytest.mark.parametrize("cancelling", [False, True])
def test_the_end_of_a_job_ends_what_it_left_unless_a_cancel_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cancelling: bool, held: str
) -> None:
    """What a job that ended left in its cgroup or carrying its mark is ended before
    its end is recorded (`Executor.release`); not while a cancel is under way, which
    ends them with each process's SIGTERM and grace (an end recorded meanwhile must
    not cut it); nothing is asked of a job with neither."""
    ctx, store, _ = policy_worker(tmp_path)
    mark = new_mark()
    cgroup = f"/sys/fs/cgroup/x/runwarden/{mark}" if held == "cgroup" else None
    job = JobId(
        dir=str(tmp_path / "r1"),
        pid=dead_pid(),
        cgroup=cgroup,
        mark=mark if held == "mark" else None,
    )
    run = running_run(store, tmp_path, "r1", job=job)
    released: list[JobId] = []
    monkeypatch.setattr(type(ctx.executor("local")), "release", lambda self, j: released.append(j))
    if cancelling:
        assert store.locks.once(cancel_key(run.id), ttl_s=CANCEL_RETRY_S)
    record = finish(ctx, run, JobStatus.CANCELLED, ctx.executor("local"))
    assert record.state is RunState.CANCELLED
    assert released == ([] if cancelling or held == "neither" else [job])


# --- a proof seen by the follow -------------------------------------------------------


@pytest.fixture
def job() -> Iterator[int]:
    """A live job: a process leading a process group of its own; its pid."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


def prove(run_dir: Path, written: float, step: int = 21, link: str | None = None) -> None:
    """The job's side: its checkpoint (a link to `link` instead, when given), then its
    proof, saying it was written at `written`."""
    checkpoint = run_dir / "output" / f"checkpoint-{step}"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    if link is None:
        checkpoint.mkdir()
        (checkpoint / "weights.bin").write_bytes(b"w" * 64)
    else:
        checkpoint.symlink_to(link)
    proof = {"checkpoint": f"output/checkpoint-{step}", "step": step, "time": written}
    (run_dir / "snapshot.json").write_text(json.dumps(proof))


def test_a_tick_sees_the_proof_and_the_end_deadline_counts_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: int
) -> None:
    ctx, store, sent = policy_worker(tmp_path, end_timeout_s=60)
    run = running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=job))
    asked = datetime.now(UTC) - timedelta(seconds=10)
    stop = stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", asked)
    watch_target(ctx, "local", datetime.now(UTC))  # no proof yet: nothing moves
    assert store.stops.get("r1") == stop
    written = asked + timedelta(seconds=3)
    prove(tmp_path / "r1", written.timestamp())
    watch_target(ctx, "local", datetime.now(UTC))
    moved = store.stops.get("r1")
    assert moved is not None
    assert moved.phase is StopPhase.WAITING_END
    assert moved.end_deadline == written + timedelta(seconds=60)
    [countdown] = [c for n, _, c in sent.calls if n == TASK_END_TIMEOUT]
    assert 48 < countdown <= 53  # from the proof (10 s ago, 3 s after asking): not 60
    [seen] = [e for e in store.ledger.events("r1") if isinstance(e, ProofSeen)]
    assert (seen.at, seen.seen_by, seen.due, seen.step) == (written, "follow", None, 21)
    assert seen.seen_at is not None
    assert seen.at < seen.seen_at
    assert seen.end_deadline == moved.end_deadline
    assert [s.kind for s in store.budgets.saves("r1")] == ["stop"]  # a save time learned
    # The proof deadline's task, racing with the tick on the stop it read, moves nothing.
    monkeypatch.setattr(cancels, "_escalate", lambda *a: pytest.fail("no cancel"))
    proof = finishing.read_proof(ctx.executor("local"), run)
    assert isinstance(proof, ProofSaved)
    assert cancels._proof_deadline(ctx, stop, run, proof, stop.proof_deadline) == "proved"
    assert stops.proof_seen(ctx, stop, proof, datetime.now(UTC), "follow") is None
    assert store.stops.get("r1") == moved
    assert [e.kind for e in store.ledger.events("r1")].count("proof_seen") == 1
    assert len([n for n, _, _ in sent.calls if n == TASK_END_TIMEOUT]) == 1
    # The next ticks read no proof: the stop waits for the end now.
    watch_target(ctx, "local", datetime.now(UTC))
    assert store.stops.get("r1") == moved


@pytest.mark.parametrize(
    ("link", "why"),
    [
        ("/etc", "checkpoint output/checkpoint-21 is a symbolic link"),
        (None, "checkpoint output/checkpoint-21: output is a symbolic link"),
    ],
)
def test_a_proof_with_a_linked_checkpoint_is_never_seen_and_its_deadline_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link: str | None, why: str, job: int
) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=job))
    stop = stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", datetime.now(UTC))
    if link is not None:
        prove(tmp_path / "r1", time.time(), link=link)
    else:  # a link on a parent component: `output` leads out of the run directory
        prove(tmp_path / "elsewhere", time.time())
        (tmp_path / "r1" / "output").symlink_to(tmp_path / "elsewhere" / "output")
        (tmp_path / "r1" / "snapshot.json").write_bytes(
            (tmp_path / "elsewhere" / "snapshot.json").read_bytes()
        )
    for _ in range(2):
        watch_target(ctx, "local", datetime.now(UTC))
        assert store.stops.get("r1") == stop
    assert not [e for e in store.ledger.events("r1") if isinstance(e, ProofSeen)]
    assert finishing.read_proof(ctx.executor("local"), run) == ProofInvalid(why=why)
    notes: list[str] = []
    monkeypatch.setattr(cancels, "_escalate", lambda ctx, stop, note, now: notes.append(note) or "")
    cancels.on_deadline(ctx, "r1", stop.stop_id, stop.proof_deadline)
    assert len(notes) == 1
    assert notes[0].startswith(f"no valid snapshot ({why})")
    # Its end says so too: never stopped with that snapshot.
    record = finish(ctx, run, JobStatus.CANCELLED, ctx.executor("local"))
    assert record.state is RunState.CANCELLED
    assert record.snapshot is None
    assert record.message is not None
    assert why in record.message


def test_a_proof_not_valid_yet_is_judged_again_only_when_it_changed_or_has_aged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: int
) -> None:
    """A proof whose checkpoint is missing is judged once, then not again while its
    file stays the same; it is once it changed, and after PROOF_REREAD_S (so a
    checkpoint completed after its proof is still seen)."""
    ctx, store, _ = policy_worker(tmp_path)
    running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=job))
    stops.request_snapshot(ctx, "r1", SnapshotReason.REQUESTED, "cli", datetime.now(UTC))
    written = time.time()
    proof = {"checkpoint": "output/checkpoint-21", "step": 21, "time": written}
    (tmp_path / "r1" / "snapshot.json").write_text(json.dumps(proof))
    judged: list[int] = []
    real = watching.judge_proofs

    def judge(executor: Any, proofs: Any) -> Any:
        judged.append(len(proofs))
        return real(executor, proofs)

    monkeypatch.setattr(watching, "judge_proofs", judge)
    for _ in range(3):
        watch_target(ctx, "local", datetime.now(UTC))
    assert judged == [1]  # not valid (no checkpoint); not read again since
    (tmp_path / "r1" / "snapshot.json").write_text(
        json.dumps({**proof, "checkpoint": "output/checkpoint-22", "step": 22})
    )
    watch_target(ctx, "local", datetime.now(UTC))
    assert judged == [1, 1]  # changed: read and judged again (still not valid)
    (tmp_path / "r1" / "snapshot.json").write_text(json.dumps(proof))
    watch_target(ctx, "local", datetime.now(UTC))
    assert judged == [1, 1, 1]
    checkpoint = tmp_path / "r1" / "output" / "checkpoint-21"
    checkpoint.mkdir(parents=True)  # the checkpoint comes after its proof, which stays
    (checkpoint / "weights.bin").write_bytes(b"w" * 64)
    watch_target(ctx, "local", datetime.now(UTC))
    assert judged == [1, 1, 1]  # not read: its file did not change
    monkeypatch.setattr(watching, "PROOF_REREAD_S", 0.0)  # ... until it has aged
    watch_target(ctx, "local", datetime.now(UTC))
    assert judged == [1, 1, 1, 1]
    moved = store.stops.get("r1")
    assert moved is not None
    assert moved.phase is StopPhase.WAITING_END


def test_the_tick_that_sees_an_end_records_it_from_what_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of a job that proved and ended on the asking signal is recorded from the
    tick's own reads (its proof, the wrapper's `.runwarden/ended`): no read of the
    target's files after the tick, the checkpoint judged once."""
    ctx, store, _ = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=dead_pid()))
    asked = datetime.now(UTC) - timedelta(seconds=5)
    stops.request_snapshot(ctx, "r1", SnapshotReason.DEADLINE, "cli", asked)
    prove(tmp_path / "r1", time.time())
    proof = json.loads((tmp_path / "r1" / "snapshot.json").read_text())
    (tmp_path / "r1" / "snapshot.json").write_text(json.dumps({**proof, "reason": "deadline"}))
    (tmp_path / "r1" / ".runwarden").mkdir(exist_ok=True)
    (tmp_path / "r1" / ".runwarden" / "ended").write_text("signal TERM\n")
    (tmp_path / "r1" / "exit_code").write_text("143\n")
    executor = ctx.executor("local")
    monkeypatch.setattr(
        type(executor), "read_from", lambda *a: pytest.fail(f"read after the tick: {a[1:]}")
    )
    found = watch_target(ctx, "local", datetime.now(UTC))
    assert found["ended"] == 1
    ended = store.runs.get(run.id)
    assert ended.state is RunState.STOPPED, ended
    assert ended.snapshot is not None
    assert ended.snapshot.step == 21
    assert ended.message is not None
    assert "SIGTERM" in ended.message, ended.message


def test_an_end_the_follow_reports_is_recorded_only_when_the_status_path_confirms_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: int
) -> None:
    """However a follow's answer came to say a job ended (its stream is a job's bytes
    framed: were the framing beaten), the run is ended only when a status script of
    its own says so too: a live job stays running and followed."""
    ctx, store, _ = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=job))
    executor = ctx.executor("local")
    real = type(executor).follow

    def forged(self: Any, *args: Any, **kwargs: Any) -> Any:
        return [replace(u, status=JobStatus.exited(0)) for u in real(self, *args, **kwargs)]

    monkeypatch.setattr(type(executor), "follow", forged)
    found = watch_target(ctx, "local", datetime.now(UTC))
    assert found["ended"] == 0
    assert store.runs.get(run.id).state is RunState.RUNNING
    assert run.id in store.follow.runs("local")


# --- the order of a tick's work -------------------------------------------------------


def test_a_tick_takes_ends_and_lines_before_it_opens_the_stops_of_requests(
    tmp_path: Path, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many runs' requests found at once (one deadline shared by many runs) open many
    stops: the end of another run and every run's new lines are taken first."""
    ctx, store, _ = policy_worker(tmp_path)
    asking = [
        running_run(store, tmp_path, f"r{i}", job=JobId(dir=str(tmp_path / f"r{i}"), pid=job))
        for i in (0, 2)
    ]
    ended = running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=dead_pid()))
    (tmp_path / "r1" / "exit_code").write_text("0\n")
    for run in asking:
        (tmp_path / run.id / "snapshot.request").write_text("deadline")
        (tmp_path / run.id / "job.log").write_text("step 1\n")
    seen: list[tuple[str, bool, list[int]]] = []
    opened = watching.notice_request

    def noticing(ctx_: Any, run: Any, reason: str, now: datetime, **kw: Any) -> None:
        logs = [store.follow.offsets(r.id).log for r in asking]
        seen.append((run.id, store.runs.get(ended.id).state.is_terminal, logs))
        opened(ctx_, run, reason, now, **kw)

    monkeypatch.setattr(watching, "notice_request", noticing)
    found = watch_target(ctx, "local", datetime.now(UTC))
    assert found == {"runs": 3, "ended": 1}
    assert [run_id for run_id, _, _ in seen] == ["r0", "r2"]
    assert all(ended_first and all(logs) for _, ended_first, logs in seen), seen
    assert store.runs.get("r1").state is RunState.SUCCEEDED
    assert all(store.stops.get(run.id) is not None for run in asking)


def test_a_store_out_of_reach_never_stops_the_follow_of_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis restarting while a tick reads the records: the tick fails (retried next
    time), every run stays followed. Before, each run read as "unreadable" and was
    dropped from the follow for good (a chaos campaign's five runs that never ended)."""
    ctx, store, _ = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=dead_pid()))

    def down(*_: Any, **__: Any) -> Any:
        try:
            raise redis.ConnectionError("Error 2 connecting to redis.sock")
        except redis.ConnectionError as error:
            raise StoreError("run store: cannot reach Redis") from error

    monkeypatch.setattr(type(store.runs), "get_many", down)
    monkeypatch.setattr(type(store.runs), "get", down)
    with pytest.raises(StoreError):
        watch_target(ctx, "local", datetime.now(UTC))
    monkeypatch.undo()
    assert store.follow.runs("local") == [run.id]
    # A record that does not parse is another matter: dropped from the follow by its
    # target (reading its target from it failed, and so did every tick of the target).
    store.client.set(store.keys.run(run.id), b"{not json")
    watch_target(ctx, "local", datetime.now(UTC))
    assert store.follow.runs("local") == []
