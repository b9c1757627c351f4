"""Preempted runs continued elsewhere (`schemas.chain`): once the checkpoint of a run
that ended preempted is retrieved and verified, the next run of its chain is launched
from it on the first available target of its list, exactly once.

The continuation is durable from the moment the run ends: the transition that ends it
records it `waiting` and queues it in the store (`store.continuations`), in one
transaction. `continue_run` is sent when its retrieval is done, and `reconcile` sends
it again for every continuation still due, so a worker killed at any point delays it
by at most a reconcile period or a retry. The next run's launch key is derived from
the preempted run (`continuation_key`), so a launch sent twice starts one run.
"""

from __future__ import annotations

import logging
import secrets as _secrets
from datetime import datetime, timedelta
from typing import Final

from schemas import ArtifactsPhase, RunRecord, RunwardenError
from schemas.auth import WORKER
from schemas.chain import (
    CONTINUE_RETRY_S,
    Continuation,
    ContinuationPhase,
    candidate_targets,
    continuation_key,
)
from schemas.events import TASK_LAUNCH, LaunchSpec, resume_spec
from schemas.idempotency import owned_launch_key
from schemas.run import ADOPTED_COMMAND

from .context import Context
from .launch import resumable
from .permits import check_launch

log = logging.getLogger("runwarden")

__all__ = [
    "CONTINUE_GIVE_UP_S",
    "continue_run",
]

CONTINUE_GIVE_UP_S: Final = 24 * 3600.0
"""How long a continuation may wait for an available target before it is declined,
in seconds from the run's end."""
_LOCK_S: Final = 120.0


def _set(ctx: Context, run_id: str, continuation: Continuation) -> Continuation | None:
    """Records `continuation` on `run_id` when its continuation is still waiting (a
    compare-and-set: a concurrent decision is kept)."""

    def mutate(current: RunRecord) -> RunRecord | None:
        waiting = current.continuation
        if waiting is None or waiting.phase is not ContinuationPhase.WAITING:
            return None
        return current.model_copy(update={"continuation": continuation})

    return ctx.store.runs.update(run_id, mutate).continuation


def _decline(ctx: Context, run: RunRecord, why: str, now: datetime) -> Continuation | None:
    waiting = run.continuation
    assert waiting is not None
    log.warning("run %s: not continued: %s", run.id, why)
    declined = waiting.model_copy(
        update={"phase": ContinuationPhase.DECLINED, "reason": why, "at": now}
    )
    return _set(ctx, run.id, declined)


def _next_spec(run: RunRecord, target: str) -> LaunchSpec:
    """The launch of the run that continues `run` on `target`: exactly what
    `runwarden resume RUN --target TARGET` launches (`schemas.events.resume_spec`:
    the same command and every per-run launch setting, its `--preemption`, timeouts,
    limits and on-preempt plan included), resumed from `run`, with the chain's key."""
    return resume_spec(run, target=target, key=continuation_key(run.id))


def _pick_target(ctx: Context, run: RunRecord) -> tuple[str | None, list[str]]:
    """The first target of the run's list that is defined, allows what the launch
    asks (secrets, upload), and answers; and why each one before it was passed over."""
    assert run.on_preempt is not None
    passed: list[str] = []
    for target in candidate_targets(run.on_preempt, run.target):
        try:
            spec = _next_spec(run, target)
            executor = ctx.executor_for(check_launch(ctx, spec).target)
            executor.disk_usage([executor.workdir])  # answers, and has a filesystem
        except RunwardenError as error:
            passed.append(f"{target}: {str(error)[:200]}")
            continue
        return target, passed
    return None, passed


def continue_run(ctx: Context, run_id: str, now: datetime) -> Continuation | None:
    """Continues the preempted run `run_id` when its continuation is waiting: declines
    it when its chain's preemptions exceed its plan's `max_preemptions`, when it was
    adopted (its command is unknown), or when its checkpoint cannot be retrieved;
    waits while the retrieval is pending; else launches the next run from the
    verified checkpoint on the first available target (`_pick_target`) and records it
    launched. With no target available it waits and is tried again after
    `CONTINUE_RETRY_S`, declined once `CONTINUE_GIVE_UP_S` have passed since the run
    ended. Returns the continuation as recorded (None: the run has none). One call
    acts at a time per run (a lock); a concurrent one returns what is recorded.

    Raises:
        NotFound: no such run. StoreError: Redis trouble (the continuation stays
            queued).
    """
    lock, token = f"continue:{run_id}", _secrets.token_hex(16)
    if not ctx.store.locks.lock(lock, token, _LOCK_S):
        return ctx.store.runs.get(run_id).continuation
    try:
        run = ctx.store.runs.get(run_id)
        waiting, plan = run.continuation, run.on_preempt
        if waiting is None or waiting.phase is not ContinuationPhase.WAITING or plan is None:
            return waiting
        if waiting.preemptions > plan.max_preemptions:
            return _decline(
                ctx,
                run,
                f"preempted {waiting.preemptions} times in its chain: at most "
                f"{plan.max_preemptions} are resumed (--max-preemptions)",
                now,
            )
        if run.command == ADOPTED_COMMAND:
            return _decline(ctx, run, "it was adopted: its command is unknown", now)
        artifacts = run.artifacts
        if artifacts is None or artifacts.phase is ArtifactsPhase.PENDING:
            return waiting  # sent again when its retrieval is done
        if artifacts.phase is ArtifactsPhase.FAILED:
            why = f"its checkpoint could not be retrieved ({artifacts.error or 'no reason'})"
            return _decline(ctx, run, why, now)
        try:
            resumable(ctx, run.id)  # the stored checkpoint, complete
        except RunwardenError as error:
            return _decline(ctx, run, str(error)[:300], now)
        target, passed = _pick_target(ctx, run)
        if target is None:
            ended = run.ended or now
            why = "no target available: " + "; ".join(passed)
            if (now - ended).total_seconds() >= CONTINUE_GIVE_UP_S:
                return _decline(ctx, run, why, now)
            log.warning("run %s: continuation waits: %s", run.id, why)
            retry = now + timedelta(seconds=CONTINUE_RETRY_S)
            noted = _set(ctx, run.id, waiting.model_copy(update={"reason": why[:500]}))
            ctx.store.continuations.schedule(run.id, retry)
            return noted
        spec = _next_spec(run, target)
        ctx.schedule(TASK_LAUNCH, {"body": spec.model_dump(mode="json")}, 0.0)
        launched = waiting.model_copy(
            update={
                "phase": ContinuationPhase.LAUNCHED,
                "target": target,
                # The key it is stored under: the workers sign the launch.
                "key": None if spec.key is None else owned_launch_key(WORKER, spec.key),
                "reason": "; ".join(passed)[:500] or None,
                "at": now,
            }
        )
        log.info(
            "run %s: preempted (%d of at most %d): continued on %s (launch key %s)",
            run.id, waiting.preemptions, plan.max_preemptions, target, spec.key,
        )  # fmt: skip
        return _set(ctx, run.id, launched)
    finally:
        ctx.store.locks.unlock(lock, token)
