"""Regression tests for pipeline faults found by review, each failing before its
fix: duplicate deadline and cancel messages signalled the job more than once, and a
worker killed in the middle of a watch tick stalled that target's watch for a
minute."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from schemas import RunRecord, RunState
from schemas.events import TASK_PROOF_TIMEOUT

from ...conftest import wait_for
from ...pipeline import Pipeline
from ..service.test_faults import (  # noqa: F401 - fixtures
    deadlines_of,
    launch,
    outcome_lines,
    pipeline,
    sigterms,
    slow_term,
    two_workers,
)

pytestmark = pytest.mark.slow


def test_duplicate_deadline_and_cancel_messages_signal_the_job_once(
    two_workers: Pipeline,  # noqa: F811
) -> None:
    """The proof countdown of a stop delivered three times around its due time, and a
    run cancelled twice, 0.3 s apart, with two workers: each job gets one SIGTERM
    (its jobs take 1 s to end on SIGTERM, as a real training job saving its state)."""
    p = two_workers
    ignoring = launch(p, command=slow_term(p, 1.0, "--ignore-requests"))
    cancelled = launch(p, command=slow_term(p, 1.0))
    for run_id in (ignoring, cancelled):
        p.wait_step(run_id, 2)

    stop = p.api.stop(ignoring, asked_by="test")
    body = {"run_id": ignoring, "stop_id": stop.stop_id}
    duplicates = [
        p.api.app.send_task(
            TASK_PROOF_TIMEOUT,
            kwargs={"body": body},
            eta=stop.proof_deadline + timedelta(seconds=0.3 * i),
        )
        for i in range(3)
    ]

    answers: list[RunRecord | Exception] = []

    def cancel(delay_s: float) -> None:
        time.sleep(delay_s)
        try:
            answers.append(p.api.cancel(cancelled))
        except Exception as error:  # noqa: BLE001 - a refusal is fine, a second cancel not
            answers.append(error)

    threads = [threading.Thread(target=cancel, args=(d,)) for d in (0.0, 0.3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert p.wait_state(cancelled).state is RunState.CANCELLED, answers
    assert p.wait_state(ignoring, timeout_s=40).state is RunState.CANCELLED
    results = [d.get(timeout=30) for d in duplicates]
    time.sleep(1.0)

    counts = {run_id: sigterms(p, run_id) for run_id in (ignoring, cancelled)}
    assert counts == {ignoring: 1, cancelled: 1}, (counts, results, answers)


def kill_in_the_middle_of_a_tick(
    pipeline: Pipeline,  # noqa: F811
    name: str = "w1",
    tries: int = 5,
) -> None:
    """SIGKILLs worker `name` while it holds the watch tick lock of target `local`
    (restarting it and trying again when the kill came between two ticks)."""
    client = pipeline.redis.client()
    key = b"rw:once:watch:local"
    try:
        for _ in range(tries):
            deadline = time.monotonic() + 10
            while not client.exists(key):
                assert time.monotonic() < deadline, "no watch tick in 10 s"
            pipeline.kill_worker(name)
            if client.pttl(key) > 0:
                return
            pipeline.start_worker(name)
            pipeline.wait_worker(name)
        raise AssertionError(f"never killed {name} in the middle of a tick in {tries} tries")
    finally:
        client.close()


def test_a_worker_killed_in_the_middle_of_a_tick_does_not_stall_the_watch(
    pipeline: Pipeline,  # noqa: F811
) -> None:
    """After a worker died holding a target's tick lock, a fresh worker still picks
    up a request written by someone else within one REQUEST_POLL (and a tick)."""
    settings = pipeline.api.settings
    run_id = launch(pipeline, "--ignore-requests")
    pipeline.wait_step(run_id, 2)
    kill_in_the_middle_of_a_tick(pipeline)
    pipeline.start_worker("w2")
    pipeline.wait_worker("w2")
    run_dir = Path(pipeline.api.get_run(run_id).remote_dir)
    (run_dir / "snapshot.request").write_text("deadline")
    limit = settings.request_poll_s + settings.follow_poll_s + 3.0
    wait_for(lambda: pipeline.api.get_stop(run_id) is not None, timeout_s=limit)
    run = pipeline.wait_state(run_id, timeout_s=40)
    assert run.state is RunState.CANCELLED, run
