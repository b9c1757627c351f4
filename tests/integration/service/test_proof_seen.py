"""A stop's proof is seen when it comes, and only a real checkpoint is one, end to end:
real redis-server, Celery workers (the follow ticks on a worker of their own, as
`runwarden serve` lays them out) and beat, real jobs on the local target and on an
SSH target against a real sshd (bench/harness/pipeline.py), one service for the module.

- A job that proves and then hangs (the end of distributed training: a collective
  that never returns after the save) is cancelled within its end timeout plus one
  follow period of its proof, on both targets, though its proof timeout is far
  longer; the ledger's `proof_seen` is the proof's own time, seen by the follow, and
  the proof latency metric records about the real latency, not the proof timeout.
- A proof whose checkpoint is a symbolic link (`output/checkpoint-21 -> /etc`), or
  sits below one (`output -> elsewhere`), is refused with the reason: the stop never
  waits for the end, the run is not `stopped` with that snapshot.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bench.harness.pipeline import CLOCKS, Pipeline, running_pipeline, ssh_target, toy
from bench.harness.sshd import SshServer
from schemas import RunLimits, RunRecord, RunState, StopPhase
from schemas.budget import StopTimeouts
from schemas.events import LaunchSpec
from schemas.ledger import CancelDecided, LedgerEvent, ProofSeen
from schemas.metrics import PROOF_LATENCY
from workers.executors import quote

from ...conftest import wait_for

pytestmark = pytest.mark.slow

TICK_S = float(CLOCKS["RUNWARDEN_FOLLOW_POLL_S"])
PROOF_S = 30.0
"""The hanging jobs' proof timeout: a cancel counted from the proof deadline would
come 30 s late."""
END_S = 3.0
SLACK_S = 2.0
"""This shared 2-core machine's noise on top of a deadline: the countdown's delivery,
a worker busy with another task."""
NAME = f"proofseen-{secrets.token_hex(3)}"
"""The runs' name: their ids unique to this module (another service on this machine
may start runs in the same second, and a cancel sweeps the processes of its run's id)."""
SHORT_PROOF_S = 4.0
"""The linked checkpoints' proof timeout: they never prove, so they wait for it."""


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, sshd: SshServer) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("proof-seen")
    with running_pipeline(tmp, watch_worker=True) as started:
        workdir = tmp / "ssh-work"
        workdir.mkdir()
        started.api.add_target(ssh_target(sshd, workdir))
        try:
            yield started
        finally:
            started.kill_jobs()


def launch(pipeline: Pipeline, target: str, command: str, proof_s: float, end_s: float
           ) -> RunRecord:  # fmt: skip
    spec = LaunchSpec(
        target=target,
        name=NAME,
        command=command,
        limits=RunLimits(disk=False),
        timeouts=StopTimeouts(proof_timeout_s=proof_s, end_timeout_s=end_s),
    )
    return pipeline.api.launch(spec, wait_s=60)


def ledger_with(pipeline: Pipeline, run_id: str, kind: str, timeout_s: float = 60
                ) -> list[LedgerEvent]:  # fmt: skip
    def found() -> list[LedgerEvent] | None:
        events = pipeline.api.ledger(run_id)
        return events if any(e.kind == kind for e in events) else None

    events = wait_for(found, timeout_s, 0.1)
    assert isinstance(events, list)
    return events


def latency_series(pipeline: Pipeline) -> tuple[float, float]:
    """The proof latency histogram's (count, sum) as stored."""
    for series in pipeline.api.store.counters.series():
        if series.spec is PROOF_LATENCY:
            return series.count, series.sum
    return 0.0, 0.0


def test_a_job_that_proves_then_hangs_is_cancelled_an_end_timeout_after_its_proof(
    pipeline: Pipeline,
) -> None:
    api = pipeline.api
    count, total = latency_series(pipeline)
    command = toy("--steps", "100000", "--step-time", "0.05", "--hang-after-proof")
    runs = {target: launch(pipeline, target, command, PROOF_S, END_S)
            for target in ("local", "ssh")}  # fmt: skip
    for run in runs.values():
        pipeline.wait_step(run.id, 2)
    stops = {target: api.stop(run.id) for target, run in runs.items()}
    # Watched until both end: each stop waits for the end (shown `waiting end`) long
    # before its proof deadline.
    waiting: dict[str, datetime] = {}
    deadline = time.monotonic() + PROOF_S
    while time.monotonic() < deadline:
        for target, run in runs.items():
            stop = api.get_stop(run.id)
            if stop is not None and stop.phase is StopPhase.WAITING_END:
                waiting.setdefault(target, datetime.now(UTC))
        if all(api.get_run(run.id).state.is_terminal for run in runs.values()):
            break
        time.sleep(0.05)
    latencies = []
    for target, run in runs.items():
        stop = stops[target]
        written = json.loads((Path(run.remote_dir) / "snapshot.json").read_text())["time"]
        proved = datetime.fromtimestamp(written, UTC)
        assert target in waiting, target
        assert waiting[target] - proved < timedelta(seconds=TICK_S + SLACK_S), target
        ended = api.get_run(run.id)
        assert ended.state is RunState.STOPPED, (target, ended)  # cancelled with its proof
        events = ledger_with(pipeline, run.id, "cancel_decided")
        [seen] = [e for e in events if isinstance(e, ProofSeen)]
        [cancel] = [e for e in events if isinstance(e, CancelDecided)]
        assert (seen.seen_by, seen.due, seen.stop_id) == ("follow", None, stop.stop_id), target
        assert seen.at == proved, target  # the proof's own time
        assert seen.end_deadline == proved + timedelta(seconds=END_S), target
        assert seen.seen_at is not None
        assert timedelta(0) <= seen.seen_at - proved < timedelta(seconds=TICK_S + SLACK_S)
        assert cancel.cause == "end_timeout", target
        late = (cancel.at - proved).total_seconds()
        assert END_S <= late + 0.5 < END_S + TICK_S + SLACK_S + 0.5, (target, late)
        assert ended.ended is not None
        assert (ended.ended - proved).total_seconds() < END_S + TICK_S + SLACK_S + 10, target
        latencies.append((proved - stop.asked_at).total_seconds())
    # The latency metric: request -> proof, about the real latency (never the timeout).
    after_count, after_total = latency_series(pipeline)
    assert after_count == count + 2
    assert after_total - total == pytest.approx(sum(latencies), abs=0.01)
    assert all(0 <= s < 5 for s in latencies), latencies


def linked_job(parent: bool) -> str:
    """A job that, once asked, writes a proof whose checkpoint is a symbolic link
    (`-> /etc`) or sits below one (`output -> elsewhere`, a real checkpoint there),
    then hangs (the link) or exits 0 a second later (the parent)."""
    if parent:
        setup = (
            "mkdir -p elsewhere/checkpoint-21 && echo w > elsewhere/checkpoint-21/weights.bin"
            " && ln -s elsewhere output"
        )
        after = "sleep 1; exit 0"
    else:
        setup = "mkdir -p output && ln -s /etc output/checkpoint-21"
        after = "exec sleep 600"
    proof = '{"checkpoint": "output/checkpoint-21", "step": 21, "reason": "requested"}'
    return (
        "while [ ! -s snapshot.request ]; do sleep 0.1; done; "
        f"{setup}; printf '%s' {quote(proof)} > snapshot.json; {after}"
    )


def test_a_proof_whose_checkpoint_is_a_link_is_refused_with_the_reason(
    pipeline: Pipeline,
) -> None:
    api = pipeline.api
    linked = launch(pipeline, "local", linked_job(parent=False), SHORT_PROOF_S, END_S)
    below = launch(pipeline, "local", linked_job(parent=True), SHORT_PROOF_S, END_S)
    for run in (linked, below):
        api.stop(run.id)
    phases: set[StopPhase] = set()

    def ended(run: RunRecord) -> RunRecord | None:
        stop = api.get_stop(run.id)
        if stop is not None:
            phases.add(stop.phase)
        record = api.get_run(run.id)
        return record if record.state.is_terminal else None

    link_why = "checkpoint output/checkpoint-21 is a symbolic link"
    parent_why = "checkpoint output/checkpoint-21: output is a symbolic link"
    # The link: never seen as a proof; cancelled at its proof deadline, saying why.
    done = wait_for(lambda: ended(linked), SHORT_PROOF_S + 30, 0.05)
    assert isinstance(done, RunRecord)
    assert StopPhase.WAITING_END not in phases
    assert (done.state, done.snapshot) == (RunState.CANCELLED, None), done
    assert done.message is not None
    assert link_why in done.message
    events = ledger_with(pipeline, linked.id, "run_ended")
    assert not [e for e in events if isinstance(e, ProofSeen)]
    [cancel] = [e for e in events if isinstance(e, CancelDecided)]
    assert cancel.cause == "proof_timeout"
    assert cancel.note is not None
    assert link_why in cancel.note
    # Below a link: the job ends by itself; its run is failed, not stopped.
    done = wait_for(lambda: ended(below), 30, 0.05)
    assert isinstance(done, RunRecord)
    assert (done.state, done.snapshot) == (RunState.FAILED, None), done
    assert done.message is not None
    assert parent_why in done.message
    assert not [e for e in api.ledger(below.id) if isinstance(e, ProofSeen)]
    assert (Path("/etc") / "passwd").exists()  # nothing of the run reached there
