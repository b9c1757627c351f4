"""The Celery tasks, by their public names (`schemas.events`): the Celery edge of the
run operations. Each task that changes something checks its body's signature
(`auth`, `schemas.auth`: who sent it), parses the body (a `schemas` model, passed as
JSON in the `body` keyword), calls one operation of `workers.launch`, `.stops`,
`.watch`, `.policies`, `.artifacts` or `.doctor` with this process's `Context`, and
returns small JSON. An unsigned or malformed message is refused with a clear error
(`Unauthenticated`, `BadRequest`) and logged; the worker carries on. The periodic
ticks carry no body and change nothing by themselves: beat sends them unsigned.

Every task is idempotent: the operations re-read the state and act only if its phase
still applies, so a redelivered, late or duplicate message, or two workers running
the same task, change nothing more.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Final, TypeVar

from celery import current_task
from celery.signals import worker_process_init
from pydantic import BaseModel, ValidationError

from schemas import (
    BadRequest,
    NoSnapshots,
    NotFound,
    NotResumable,
    NotRunning,
    NotStarted,
    SchemaError,
    UnknownTarget,
    validation_message,
)
from schemas.auth import OPERATOR, WORKER, Unauthenticated, asked_by, new_task_id
from schemas.events import (
    TASK_CANCEL,
    TASK_CONTINUE,
    TASK_DOCTOR,
    TASK_END_TIMEOUT,
    TASK_FOLLOW,
    TASK_FOLLOW_TICK,
    TASK_LAUNCH,
    TASK_POLICY_TARGET,
    TASK_POLICY_TICK,
    TASK_PROOF_TIMEOUT,
    TASK_RECONCILE,
    TASK_RETRIEVE,
    TASK_SNAPSHOT_REQUEST,
    TASK_STOP_MANY,
    TASK_WATCH_TARGET,
    CancelBody,
    ContinueBody,
    DoctorBody,
    FollowBody,
    LaunchSpec,
    RetrieveBody,
    SnapshotRequestBody,
    StopManyBody,
    TimeoutBody,
    describe,
)
from schemas.idempotency import adopt_key, owned_launch_key, task_launch_key
from schemas.targets import TARGET_NAME
from store import RunStore

from . import bulk, cancels, chain, policies, stops, watch
from . import doctor as doctoring
from . import launch as launching
from . import reconcile as sweep
from .app import NO_EVENTS, QuietTask, app, settings
from .artifacts import retrieve_artifacts
from .context import Context, utcnow
from .errors import NotAllowed, ProducerNotAllowed, SecretMissing, SecretUnusable
from .executors import ExecError
from .memory import watch_memory
from .notify import observe_tick

__all__ = ["context"]

log = logging.getLogger("runwarden")

_lock = threading.Lock()
_context: Context | None = None


def _reset() -> None:
    global _context  # noqa: PLW0603 - one per process, rebuilt in a forked child
    _context = None


os.register_at_fork(after_in_child=_reset)


def _schedule(name: str, kwargs: dict[str, Any], countdown_s: float) -> None:
    # The workers' own messages are signed too: a worker trusts no unsigned body. Flower
    # shows what each does (`kwargsrepr`), never its signature.
    task_id = new_task_id()
    app.send_task(
        name,
        kwargs=context().identities.signed(name, kwargs, task_id),
        task_id=task_id,
        countdown=countdown_s,
        kwargsrepr=describe(name, kwargs.get("body")),
    )


def context() -> Context:
    """The run operations' context of this process (built on first use, per process)."""
    global _context  # noqa: PLW0603 - see _reset
    with _lock:
        if _context is None:
            _context = Context(RunStore.from_settings(settings), settings, _schedule)
        return _context


@worker_process_init.connect
def _deliver_waiting(**_: Any) -> None:
    """A new worker process delivers what is waiting (deliveries queued before a
    restart), without waiting for an event of its own."""
    try:
        if settings.webhooks:
            context().webhooks.start()
    except Exception:  # never stops a worker from starting
        log.exception("webhooks: cannot start the delivery threads")


_M = TypeVar("_M", bound=BaseModel)

REFUSALS: Final = (
    SchemaError,
    NotAllowed,
    ProducerNotAllowed,
    SecretMissing,
    SecretUnusable,
    NotFound,
    UnknownTarget,
    NotStarted,
    NotRunning,
    NoSnapshots,
    NotResumable,
)
"""Answers to the producer, not failures of the worker (a stop of a run that ended
meanwhile, a body that does not fit): Celery logs each as expected, on one line
without a traceback, and still hands it to the producer as the task's error."""


def _message_id() -> str | None:
    """The task id of the message this process works on now (None outside a task)."""
    request = current_task.request if current_task else None
    task_id = getattr(request, "id", None)
    return task_id if isinstance(task_id, str) else None


def _parse(model: type[_M], body: Any, auth: Any, task: str) -> tuple[_M, str]:
    """The body of `task` as a `model`, and the producer who signed it. Refused (and
    logged) when it is not signed by a known producer or does not fit its schema."""
    try:
        producer = context().identities.check(task, body, auth, _message_id())
    except Unauthenticated as error:
        log.error("%s", error)
        raise
    try:
        return model.model_validate(body), producer
    except ValidationError as error:
        message = f"{task}: invalid body: {validation_message(error, 'body')}"
        log.error("%s", message)
        raise BadRequest(message) from None


def _may_act(producer: str, target: str, what: str) -> None:
    """Refuses a message of `producer` about target `target` that the target does not
    allow (`TargetConfig.producers`; the operator and the workers always may).

    Raises:
        ProducerNotAllowed, UnknownTarget, Unauthenticated, StoreError.
    """
    if not context().target(target).allows_producer(producer):
        raise ProducerNotAllowed(producer, target, what)


def _may_act_on_run(producer: str, run_id: str, what: str) -> None:
    """[`_may_act`] on the target of run `run_id` (nothing read for the operator and
    the workers, who always may)."""
    if producer not in (OPERATOR, WORKER):
        _may_act(producer, context().store.runs.get(run_id).target, what)


# A launch uploads (a resume: a whole checkpoint), so it gets its own limits; the
# soft one raises inside `launch`, which records the run failed. Bound, for the
# message's own task id: a body without a key gets one derived from it, which a
# redelivered message keeps, so it finds the run its first delivery started.
@app.task(
    name=TASK_LAUNCH,
    bind=True,
    throws=REFUSALS,
    time_limit=int(settings.launch_max_runtime_s) + 30,
    soft_time_limit=int(settings.launch_max_runtime_s),
)
def launch(self: Any, body: Any = None, auth: Any = None) -> dict[str, Any]:
    spec, producer = _parse(LaunchSpec, body, auth, TASK_LAUNCH)
    _may_act(producer, spec.target, TASK_LAUNCH)
    task_id = self.request.id
    key = spec.key or (task_launch_key(task_id) if task_id else None)
    owned = None if key is None else owned_launch_key(producer, key)
    record = launching.launch(context(), spec, utcnow(), owned)
    return {"run_id": record.id, "pid": record.job.pid if record.job else None}


@app.task(name=TASK_FOLLOW, throws=REFUSALS)
def follow(body: Any = None, auth: Any = None) -> dict[str, Any]:
    request, producer = _parse(FollowBody, body, auth, TASK_FOLLOW)
    if request.run_id is not None:
        record = launching.follow_again(context(), request.run_id)
    else:
        assert request.target is not None
        assert request.dir is not None
        task_id = _message_id()
        key = None if task_id is None else owned_launch_key(producer, adopt_key(task_id))
        record = launching.adopt(context(), request.target, request.dir, utcnow(), key)
    return {"run_id": record.id, "state": str(record.state)}


@app.task(name=TASK_SNAPSHOT_REQUEST, throws=REFUSALS)
def snapshot_request(body: Any = None, auth: Any = None) -> dict[str, Any]:
    request, producer = _parse(SnapshotRequestBody, body, auth, TASK_SNAPSHOT_REQUEST)
    _may_act_on_run(producer, request.run_id, TASK_SNAPSHOT_REQUEST)
    ctx, now = context(), utcnow()
    stop = stops.request_snapshot(
        ctx,
        request.run_id,
        request.reason,
        asked_by(producer, request.asked_by),
        now,
        only_if_none_open=request.only_if_none_open,
    )
    if cancels.cancel_if_queued(ctx, stop, now) is not None:
        stop = ctx.store.stops.get(request.run_id) or stop
    return stop.model_dump(mode="json")


@app.task(name=TASK_STOP_MANY, throws=REFUSALS)
def stop_many(body: Any = None, auth: Any = None) -> dict[str, Any]:
    """A bulk stop (`workers.bulk`): the runs a selection picks on the named targets,
    each asked as a single stop asks, one batched write per target; the summary."""
    request, producer = _parse(StopManyBody, body, auth, TASK_STOP_MANY)
    ctx, now = context(), utcnow()
    who = asked_by(producer, request.asked_by)
    summary = bulk.stop_many(
        ctx,
        request,
        producer,
        who,
        now,
        opened=lambda stop: cancels.cancel_if_queued(ctx, stop, now),
    )
    return summary.model_dump(mode="json")


@app.task(name=TASK_CANCEL, throws=REFUSALS)
def cancel(body: Any = None, auth: Any = None) -> dict[str, Any]:
    request, producer = _parse(CancelBody, body, auth, TASK_CANCEL)
    _may_act_on_run(producer, request.run_id, TASK_CANCEL)
    record = cancels.cancel(context(), request.run_id, asked_by=producer)
    return {"run_id": record.id, "state": str(record.state)}


@app.task(name=TASK_PROOF_TIMEOUT, throws=REFUSALS)
def proof_timeout(body: Any = None, auth: Any = None) -> str:
    request, _ = _parse(TimeoutBody, body, auth, TASK_PROOF_TIMEOUT)
    return cancels.on_deadline(context(), request.run_id, request.stop_id, utcnow())


@app.task(name=TASK_END_TIMEOUT, throws=REFUSALS)
def end_timeout(body: Any = None, auth: Any = None) -> str:
    request, _ = _parse(TimeoutBody, body, auth, TASK_END_TIMEOUT)
    return cancels.on_deadline(context(), request.run_id, request.stop_id, utcnow())


def _ran(task: str) -> None:
    """Records that the periodic `task` runs now: `runwarden status` tells from it how
    late the task is (`schemas.health`)."""
    context().store.health.record_tick(task)


@app.task(name=TASK_RECONCILE, base=QuietTask)
def reconcile() -> int:
    _ran(TASK_RECONCILE)
    ctx = context()
    try:
        return sweep.reconcile(ctx, utcnow())
    finally:
        watch_memory(ctx)  # after: a full Redis fails the reconcile, and says why


@app.task(name=TASK_CONTINUE, throws=REFUSALS)
def continue_run(body: Any = None, auth: Any = None) -> dict[str, Any] | None:
    request, _ = _parse(ContinueBody, body, auth, TASK_CONTINUE)
    done = chain.continue_run(context(), request.run_id, utcnow())
    return None if done is None else done.model_dump(mode="json")


def _fan_out(task: str) -> int:
    """Sends `task` once per target with followed runs, quietly (`QuietTask`);
    returns how many."""
    targets = watch.watched_targets(context())
    for target in targets:
        app.send_task(
            task, kwargs={"target": target}, event_dispatcher=NO_EVENTS, ignore_result=True
        )
    return len(targets)


def _known_target(task: str, target: Any) -> str | None:
    """`target` when a fan-out could have sent it (a target name with followed runs),
    else None, logged: these internal tasks carry no signature, and a made-up target
    must change nothing (no tick, no lock, no metrics series of its name)."""
    named = isinstance(target, str) and TARGET_NAME.fullmatch(target) is not None
    if named and context().store.follow.has_target(target):
        return str(target)
    log.warning("%s: refused: %r is no target with followed runs", task, str(target)[:80])
    return None


@app.task(name=TASK_FOLLOW_TICK, base=QuietTask)
def follow_tick() -> int:
    _ran(TASK_FOLLOW_TICK)
    return _fan_out(TASK_WATCH_TARGET)


# A target that cannot be read this tick (out of reach, or too loaded to answer within
# the follow's deadline) is an expected failure: logged without a traceback, and the
# next tick tries again.
@app.task(name=TASK_WATCH_TARGET, base=QuietTask, throws=(ExecError,))
def watch_target(target: str) -> dict[str, int]:
    if _known_target(TASK_WATCH_TARGET, target) is None:
        return {"refused": 1}
    ctx = context()
    lock, token = f"watch:{target}", os.urandom(8).hex()
    # Ticks of one target never overlap: a slow target is skipped, not piled up. The
    # lock is held by its holder only, for at most the follow script's deadline: a
    # worker killed in the middle of a tick delays this target's watch by that long
    # (its deadlines do not wait: reconcile fires them).
    if not ctx.store.locks.lock(lock, token, ttl_s=settings.follow_timeout_s + 1.0):
        return {"skipped": 1}
    started = time.monotonic()
    try:
        return watch.watch_target(ctx, target, utcnow())
    finally:
        observe_tick(ctx, target, time.monotonic() - started)
        ctx.store.locks.unlock(lock, token)


@app.task(name=TASK_POLICY_TICK, base=QuietTask)
def policy_tick() -> int:
    """Beat: fans the policies out, one task per target with followed runs."""
    _ran(TASK_POLICY_TICK)
    return _fan_out(TASK_POLICY_TARGET)


@app.task(name=TASK_POLICY_TARGET, base=QuietTask)
def policy_target(target: str) -> dict[str, int]:
    if _known_target(TASK_POLICY_TARGET, target) is None:
        return {"refused": 1}
    ctx = context()
    lock, token = f"policy-tick:{target}", os.urandom(8).hex()
    # Held by its holder only: a slow tick never releases the next one's lock.
    if not ctx.store.locks.lock(lock, token, ttl_s=max(2.0, settings.policy_s)):
        return {"skipped": 1}
    try:
        return policies.policy_target(ctx, target, utcnow())
    finally:
        ctx.store.locks.unlock(lock, token)


# Acknowledged on receipt, not late: a retrieval may run for hours, far longer than
# the visibility timeout, and a redelivery would start it twice. A lost message loses
# nothing: the retrieval queue in the store is durable and `reconcile` sends again.
# The soft limit raises inside the attempt, which records it as a failed one.
@app.task(
    name=TASK_RETRIEVE,
    acks_late=False,
    throws=REFUSALS,
    time_limit=int(settings.retrieve_max_runtime_s) + 60,
    soft_time_limit=int(settings.retrieve_max_runtime_s),
)
def retrieve(body: Any = None, auth: Any = None) -> dict[str, Any]:
    request, _ = _parse(RetrieveBody, body, auth, TASK_RETRIEVE)
    result = retrieve_artifacts(context(), request.run_id, utcnow(), force=request.force)
    return result.model_dump(mode="json")


@app.task(name=TASK_DOCTOR, throws=REFUSALS)
def doctor(body: Any = None, auth: Any = None) -> dict[str, Any]:
    """Checks a target as this worker sees it (read-only; signed: it makes the
    worker connect, and answers what the target has)."""
    request, _ = _parse(DoctorBody, body, auth, TASK_DOCTOR)
    return doctoring.doctor(context(), request.target, utcnow()).model_dump(mode="json")
