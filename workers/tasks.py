"""The Celery tasks, by their public names (DESIGN.md §4). Bodies are `schemas`
models, passed as JSON in the `body` keyword; results are small JSON. A malformed
body is refused with a clear error and logged; the worker carries on.

Every task is idempotent: it re-reads the state and acts only if its phase still
applies (see `workers.runs`), so a redelivered, late or duplicate message, or two
workers running the same task, change nothing more.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from schemas.events import (
    TASK_CANCEL,
    TASK_END_TIMEOUT,
    TASK_FOLLOW,
    TASK_FOLLOW_TICK,
    TASK_LAUNCH,
    TASK_POLICY_TICK,
    TASK_POLL_REQUESTS,
    TASK_PROOF_TIMEOUT,
    TASK_RECONCILE,
    TASK_RETRIEVE,
    TASK_SNAPSHOT_REQUEST,
    CancelBody,
    FollowBody,
    LaunchSpec,
    RetrieveBody,
    SnapshotRequestBody,
    TimeoutBody,
)
from schemas.store import RunStore

from .app import app, settings
from .runs import Worker, utcnow

__all__ = ["TASK_POLICY_TARGET", "TASK_WATCH_TARGET", "BadRequest", "worker"]

log = logging.getLogger("runwarden")

TASK_WATCH_TARGET: Final = "runwarden.watch_target"
"""Internal: one target's share of a follow tick (fanned out by `follow_tick` and
`poll_requests`, one task per target so workers share the load)."""

TASK_POLICY_TARGET: Final = "runwarden.policy_target"
"""Internal: one target's share of a policy tick (fanned out by `policy_tick`)."""

_lock = threading.Lock()
_worker: Worker | None = None


def _reset() -> None:
    global _worker  # noqa: PLW0603 - one per process, rebuilt in a forked child
    _worker = None


os.register_at_fork(after_in_child=_reset)


def _schedule(name: str, kwargs: dict[str, Any], countdown_s: float) -> None:
    app.send_task(name, kwargs=kwargs, countdown=countdown_s)


def worker() -> Worker:
    """The run operations of this process (built on first use, per process)."""
    global _worker  # noqa: PLW0603 - see _reset
    with _lock:
        if _worker is None:
            _worker = Worker(RunStore.from_url(settings.store_url()), settings, _schedule)
        return _worker


class BadRequest(ValueError):
    """A task body that does not fit its schema; the message says what is wrong."""


_M = TypeVar("_M", bound=BaseModel)


def _parse(model: type[_M], body: Any, task: str) -> _M:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        message = f"{task}: invalid body: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
            for e in error.errors(include_input=False)
        )
        log.error("%s", message)
        raise BadRequest(message) from None


# A launch uploads (a resume: a whole checkpoint), so it gets its own limits; the
# soft one raises inside `Worker.launch`, which records the run failed.
@app.task(
    name=TASK_LAUNCH,
    time_limit=int(settings.launch_max_runtime_s) + 30,
    soft_time_limit=int(settings.launch_max_runtime_s),
)
def launch(body: Any = None) -> dict[str, Any]:
    spec = _parse(LaunchSpec, body, TASK_LAUNCH)
    record = worker().launch(spec, utcnow())
    return {"run_id": record.id, "pid": record.job.pid if record.job else None}


@app.task(name=TASK_FOLLOW)
def follow(body: Any = None) -> dict[str, Any]:
    request = _parse(FollowBody, body, TASK_FOLLOW)
    w = worker()
    if request.run_id is not None:
        run = w.store.get_run(request.run_id)
        if run.job is not None and not run.state.is_terminal:
            w.store.follow(run.id)
        return {"run_id": run.id, "state": str(run.state)}
    assert request.target is not None
    assert request.dir is not None
    record = w.adopt(request.target, request.dir, utcnow())
    return {"run_id": record.id, "state": str(record.state)}


@app.task(name=TASK_SNAPSHOT_REQUEST)
def snapshot_request(body: Any = None) -> dict[str, Any]:
    request = _parse(SnapshotRequestBody, body, TASK_SNAPSHOT_REQUEST)
    stop = worker().request_snapshot(
        request.run_id,
        request.reason,
        request.asked_by,
        utcnow(),
        only_if_none_open=request.only_if_none_open,
    )
    return stop.model_dump(mode="json")


@app.task(name=TASK_CANCEL)
def cancel(body: Any = None) -> dict[str, Any]:
    request = _parse(CancelBody, body, TASK_CANCEL)
    record = worker().cancel(request.run_id)
    return {"run_id": record.id, "state": str(record.state)}


@app.task(name=TASK_PROOF_TIMEOUT)
def proof_timeout(body: Any = None) -> str:
    request = _parse(TimeoutBody, body, TASK_PROOF_TIMEOUT)
    return worker().on_deadline(request.run_id, request.stop_id, utcnow())


@app.task(name=TASK_END_TIMEOUT)
def end_timeout(body: Any = None) -> str:
    request = _parse(TimeoutBody, body, TASK_END_TIMEOUT)
    return worker().on_deadline(request.run_id, request.stop_id, utcnow())


@app.task(name=TASK_RECONCILE)
def reconcile() -> int:
    return worker().reconcile(utcnow())


def _fan_out(task: str) -> int:
    """Sends `task` once per target with followed runs; returns how many."""
    targets = worker().store.followed_targets()
    for target in targets:
        app.send_task(task, kwargs={"target": target})
    return len(targets)


@app.task(name=TASK_FOLLOW_TICK)
def follow_tick() -> int:
    return _fan_out(TASK_WATCH_TARGET)


@app.task(name=TASK_POLL_REQUESTS)
def poll_requests() -> int:
    return _fan_out(TASK_WATCH_TARGET)


@app.task(name=TASK_WATCH_TARGET)
def watch_target(target: str) -> dict[str, int]:
    w = worker()
    lock = f"watch:{target}"
    # Ticks of one target never overlap: a slow target is skipped, not piled up.
    # The lock outlives a worker killed in the middle of a tick: keep it about as
    # short as a tick, so such a crash delays this target's watch by a tick, not a
    # minute. (A tick that runs longer may overlap the next one: harmless, every
    # write of a tick is a compare-and-set.)
    if not w.store.once(lock, ttl_s=max(2.0, settings.follow_poll_s * 2)):
        return {"skipped": 1}
    try:
        return w.watch_target(target, utcnow())
    finally:
        w.store.forget(lock)


@app.task(name=TASK_POLICY_TICK)
def policy_tick() -> int:
    """Beat: fans the policies out, one task per target with followed runs."""
    return _fan_out(TASK_POLICY_TARGET)


@app.task(name=TASK_POLICY_TARGET)
def policy_target(target: str) -> dict[str, int]:
    w = worker()
    lock, token = f"policy-tick:{target}", os.urandom(8).hex()
    # Held by its holder only: a slow tick never releases the next one's lock.
    if not w.store.lock(lock, token, ttl_s=max(2.0, settings.policy_s)):
        return {"skipped": 1}
    try:
        return w.policy_target(target, utcnow())
    finally:
        w.store.unlock(lock, token)


# Acknowledged on receipt, not late: a retrieval may run for hours, far longer than
# the visibility timeout, and a redelivery would start it twice. A lost message loses
# nothing: the retrieval queue in the store is durable and `reconcile` sends again.
# The soft limit raises inside the attempt, which records it as a failed one.
@app.task(
    name=TASK_RETRIEVE,
    acks_late=False,
    time_limit=int(settings.retrieve_max_runtime_s) + 60,
    soft_time_limit=int(settings.retrieve_max_runtime_s),
)
def retrieve(body: Any = None) -> dict[str, Any]:
    request = _parse(RetrieveBody, body, TASK_RETRIEVE)
    result = worker().retrieve(request.run_id, utcnow(), force=request.force)
    return result.model_dump(mode="json")
