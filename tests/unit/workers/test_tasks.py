"""`workers.tasks`, the Celery edge: a refusal (a run that ended meanwhile, a body that
does not fit) is an answer to the producer, declared as an expected exception of every
task a producer or a deadline sends, so the worker logs it on one line, not as a failure
with a traceback (the hostile matrix counts those: none may occur)."""

from __future__ import annotations

from schemas import NotRunning, SchemaError
from schemas.auth import Unauthenticated
from workers import tasks


def test_refusals_are_expected_of_every_task_with_a_body() -> None:
    with_body = [
        tasks.launch, tasks.follow, tasks.snapshot_request, tasks.cancel, tasks.proof_timeout,
        tasks.end_timeout, tasks.continue_run, tasks.retrieve, tasks.doctor,
    ]  # fmt: skip
    for task in with_body:
        assert set(tasks.REFUSALS) <= set(task.throws), task.name
    assert NotRunning in tasks.REFUSALS
    assert issubclass(Unauthenticated, SchemaError)
