"""Redis that fails over: the whole service (real Celery workers and beat, the test's
API) on a primary, a replica and three `redis-sentinel` processes on loopback
(bench/harness/sentinel.py), reached by a `sentinel://` URL, every deadline write
waiting for its replica (`RUNWARDEN_REDIS_MIN_REPLICAS`, 1 with Sentinel).

The primary is killed (`kill -9`) in the middle of a batch of stops: stops asked
before the kill wait for their proofs and countdowns, more are asked while the
sentinels promote the replica. Every stop ends with the right state (stopped with
its checkpoint; a job that ignores requests cancelled at its proof deadline; a job
that proves then hangs cancelled at its end deadline, stopped with its snapshot),
each run has exactly one stop, closed, no deadline is left pending or acted on twice
(the stops' cancels, the ledger's cancel and proof events), and the service keeps
working after the failover (a new launch and stop).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from schemas import NotRunning, RunLimits, RunRecord, RunState, StopState
from schemas.budget import StopTimeouts
from schemas.events import LaunchSpec

# No skip without redis-sentinel: the harness then runs `redis-server --sentinel`.
pytestmark = pytest.mark.slow

NAME = f"sentinel-{secrets.token_hex(3)}"
PROOF_S, END_S = 5.0, 3.0
KINDS = ("honours", "honours", "hangs", "ignores")
"""One batch of runs: two that stop with a checkpoint, one that proves then hangs
(cancelled at its end deadline: stopped with its snapshot), one that ignores the
request (cancelled at its proof deadline)."""
EXPECTED = {"honours": RunState.STOPPED, "hangs": RunState.STOPPED, "ignores": RunState.CANCELLED}
CANCELS = {"honours": 0, "hangs": 1, "ignores": 1}


@dataclass
class Asked:
    run: RunRecord
    kind: str
    attempts: int = 0
    stops: list[StopState] = field(default_factory=list)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("sentinel")
    with running_pipeline(tmp, sentinel=True, watch_worker=True) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


def command(kind: str) -> str:
    extra = {"honours": (), "hangs": ("--hang-after-proof",), "ignores": ("--ignore-requests",)}
    return toy("--steps", "100000", "--step-time", "0.1", *extra[kind])


def launch(pipeline: Pipeline, kind: str) -> RunRecord:
    spec = LaunchSpec(
        target="local",
        name=NAME,
        command=command(kind),
        limits=RunLimits(disk=False),
        timeouts=StopTimeouts(proof_timeout_s=PROOF_S, end_timeout_s=END_S),
    )
    return pipeline.api.launch(spec, wait_s=60)


def stop(pipeline: Pipeline, asked: Asked, deadline: float) -> None:
    """Asks the stop, again while it fails (the failover: a write no replica
    acknowledged, a primary not there yet), until `deadline`: the caller's retry."""
    while True:
        asked.attempts += 1
        try:
            asked.stops.append(pipeline.api.stop(asked.run.id, wait_s=10))
            return
        except NotRunning:
            if asked.attempts > 1:
                # An earlier attempt's stop went through on the primary though its
                # answer was lost, and the run has already ended: asked.
                return
            raise
        except Exception:  # any failure during the failover is retried
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_a_failover_in_the_middle_of_stops_loses_no_stop_and_fires_no_deadline_twice(
    pipeline: Pipeline,
) -> None:
    cluster = pipeline.sentinel
    assert cluster is not None
    api = pipeline.api
    before = [Asked(launch(pipeline, kind), kind) for kind in KINDS]
    during = [Asked(launch(pipeline, kind), kind) for kind in KINDS]
    for asked in before + during:
        pipeline.wait_step(asked.run.id, 2)

    # The first batch asked; its proofs, end countdowns and proof countdowns in flight.
    for asked in before:
        stop(pipeline, asked, time.monotonic() + 30)
    old = cluster.kill_primary()
    killed = time.monotonic()
    # The second batch asked while the sentinels promote the replica.
    for asked in during:
        stop(pipeline, asked, time.monotonic() + 30)
    new = cluster.wait_failover(old.port)
    promoted_s = time.monotonic() - killed
    # The old primary comes back; the sentinels make it the new one's replica, and
    # the deadline writes have a replica to wait for again.
    old.start()
    cluster.wait_replicas(new, 1, timeout_s=40)
    replica_back_s = time.monotonic() - killed

    for asked in before + during:
        run = pipeline.wait_state(asked.run.id, timeout_s=40)
        assert run.state is EXPECTED[asked.kind], (asked.kind, run, pipeline.logs())
        if run.state is RunState.STOPPED:
            assert run.snapshot is not None
            assert (Path(run.remote_dir) / run.snapshot.checkpoint).is_dir()
    ended_s = time.monotonic() - killed

    # Every stop accounted for: one per run, closed, the cancels as its job called
    # for; none left open, no deadline left pending.
    counted = 0
    for asked in before + during:
        history = api.store.stops.history(asked.run.id)
        assert len(history) == 1, (asked.kind, history)
        closed = history[0]
        assert closed.closed_at is not None
        assert closed.cancels == CANCELS[asked.kind], (asked.kind, closed)
        assert all(s.stop_id == closed.stop_id for s in asked.stops), (asked.stops, closed)
        kinds = [e.kind for e in api.ledger(asked.run.id)]
        # The ledger tells each deadline's act once at most (an event written in the
        # failover's window may be lost: the ledger tells, the stop decides).
        assert kinds.count("cancel_decided") <= 1, kinds
        assert kinds.count("proof_seen") <= 1, kinds
        assert kinds.count("stop_opened") <= 1, kinds
        counted += 1
    assert counted == len(KINDS) * 2
    assert [s.run_id for s in api.store.stops.in_progress() if s.run_id.find(NAME) >= 0] == []
    pending = [d for d in api.store.stops.pending_deadlines() if NAME in d.run_id]
    assert pending == []

    # The service goes on: a new run launched and stopped with its checkpoint.
    after = Asked(launch(pipeline, "honours"), "honours")
    pipeline.wait_step(after.run.id, 2)
    stop(pipeline, after, time.monotonic() + 10)
    run = pipeline.wait_state(after.run.id, timeout_s=30)
    assert run.state is RunState.STOPPED
    assert len(api.store.stops.history(after.run.id)) == 1
    retried = sum(a.attempts - 1 for a in before + during)
    print(
        f"\nfailover: {counted + 1} stops counted, {retried} asked again during the "
        f"failover; promoted {promoted_s:.1f} s after the kill, replica back at "
        f"{replica_back_s:.1f} s, every stop ended at {ended_s:.1f} s"
    )
