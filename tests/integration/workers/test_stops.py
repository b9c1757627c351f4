"""`workers.stops` through the whole service (real redis-server, Celery workers and
beat, bench/harness/pipeline.py): duplicate deadline and cancel messages signal a job once."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from bench.harness.pipeline import Pipeline
from schemas import RunRecord, RunState
from schemas.events import TASK_PROOF_TIMEOUT

from ..service.test_faults import (  # noqa: F401 - fixtures
    launch,
    sigterms,
    slow_term,
    two_workers,
)


# Regression (found by review, failed before its fix): duplicate deadline and cancel messages
# signalled the job more than once.
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
        p.send(TASK_PROOF_TIMEOUT, body, eta=stop.proof_deadline + timedelta(seconds=0.3 * i))
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
