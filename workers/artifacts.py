"""A finished run's artifacts: the retrieval task (attempts counted, backoff, a lock
with a heartbeat), around the verified retrieval of `workers.retrieval`. The task is
sent by `workers.finish.queue_retrieval` when a run ends, and again by
`workers.reconcile` while the store's retrieval queue holds it."""

from __future__ import annotations

import logging
import secrets as _secrets
import threading
import time
from datetime import datetime, timedelta
from typing import Final

from schemas import Artifacts, ArtifactsPhase, Conflict, RunError, RunRecord
from schemas.chain import ContinuationPhase
from schemas.events import TASK_CONTINUE

from .context import Context, utcnow
from .errors import ArtifactQuotaExceeded, RetrievalError
from .executors import ExecError
from .notify import emit, retrieved
from .retrieval import ArtifactLimits, retrieval_plan, retrieve, reuse_stored

log = logging.getLogger("runwarden")

__all__ = [
    "RETRIEVE_LEASE_S",
    "retrieve_artifacts",
]

RETRIEVE_LEASE_S: Final = 120.0
"""How long a retrieval's lock lasts without its worker extending it, in seconds."""


def _due(run: RunRecord, now: datetime) -> bool:
    artifacts = run.artifacts
    if artifacts is None:
        return run.job is not None
    if artifacts.phase is not ArtifactsPhase.PENDING:
        return False
    return artifacts.next_attempt is None or artifacts.next_attempt <= now + timedelta(seconds=1)


def retrieve_artifacts(
    ctx: Context, run_id: str, now: datetime, *, force: bool = False
) -> Artifacts:
    """Brings the artifacts of the ended run `run_id` into the artifact store, verified
    against the target's manifest (`workers.retrieval.retrieve`), and records the
    result, within the artifact store's quotas and disk reserve (a retrieval that
    would pass one is recorded failed at once, with the reason: a person acts, then
    forces it); a retrieval of a run with a snapshot that did not bring its
    checkpoint home (no regular file under it on the target) is recorded failed at
    once, with the reason, never done. The attempt is counted before it starts (a
    worker killed mid-way still counts it); any other failure is recorded with its
    error and tried again after a backoff (`retrieve_backoff_s`, doubled each time, at most
    `retrieve_backoff_max_s`; the maximum at once for an error that needs a person)
    until `retrieve_attempts`, then marked failed: never dropped silently. A call
    before the next attempt is due, or for a retrieval done or given up, changes
    nothing (a duplicate task). `force` (a person's `runwarden retrieve`) tries now,
    whatever the state. A stored copy that
    lost a file or changed a file's size is moved aside and retrieved again. One
    retrieval of a run runs at a time, under a lock held by its holder only.

    Raises:
        NotFound: no such run.
        Conflict: the run has not ended, or (with `force`) a retrieval of it is
            running now.
    """
    run = ctx.store.runs.get(run_id)
    if not run.state.is_terminal:
        raise Conflict(f"run {run_id!r} is {run.state}: its artifacts come when it ends")
    if not force and not _due(run, now):
        return run.artifacts or Artifacts(phase=ArtifactsPhase.FAILED, error="no job")
    lock, token = f"retrieve:{run_id}", _secrets.token_hex(16)
    if not ctx.store.locks.lock(lock, token, RETRIEVE_LEASE_S):
        if force:
            raise Conflict(f"a retrieval of run {run_id!r} is running now")
        return run.artifacts or Artifacts()
    # While it runs, the lock and the queue entry are kept ahead of the clock, so
    # reconcile does not send it again; a worker killed mid-way lets both lapse within
    # a lease, and reconcile sends it again then.
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(RETRIEVE_LEASE_S / 4):
            try:
                if not ctx.store.locks.extend(lock, token, RETRIEVE_LEASE_S):
                    log.error("run %s: the retrieval lock lapsed", run_id)
                    return
                ctx.store.retrievals.schedule(
                    run_id, utcnow() + timedelta(seconds=RETRIEVE_LEASE_S)
                )
            except Exception:  # noqa: BLE001 - Redis trouble: the lease may lapse
                log.warning("run %s: cannot extend the retrieval lease", run_id)

    beat = threading.Thread(target=heartbeat, name=f"lease-{run_id}", daemon=True)
    try:
        run = ctx.store.runs.get(run_id)  # as it is now that this call holds the lock
        if not force and not _due(run, now):
            return run.artifacts or Artifacts()
        attempts = (run.artifacts.attempts if run.artifacts else 0) + 1
        previous = run.artifacts.error if run.artifacts else None
        lease_end = utcnow() + timedelta(seconds=RETRIEVE_LEASE_S)
        counted = Artifacts(attempts=attempts, error=previous, next_attempt=lease_end)
        ctx.store.runs.update(run_id, lambda r: r.model_copy(update={"artifacts": counted}))
        beat.start()
        try:
            result = _attempt(ctx, run, attempts, now)
        finally:
            done.set()
            beat.join()

        def record(current: RunRecord) -> RunRecord | None:
            stored = current.artifacts
            if stored is not None and stored.phase is ArtifactsPhase.DONE and not force:
                return None  # another retrieval finished meanwhile: keep it
            return current.model_copy(update={"artifacts": result})

        ended = ctx.store.runs.update(run_id, record)
        emit(ctx, retrieved, run, result, utcnow())  # told once it is recorded
        if ended.continuation is not None and ended.continuation.phase is ContinuationPhase.WAITING:
            # A preempted run to continue (`workers.chain`): its checkpoint is here now.
            ctx.send(TASK_CONTINUE, run_id)
        return ended.artifacts or result
    finally:
        done.set()
        ctx.store.locks.unlock(lock, token)


def _attempt(ctx: Context, run: RunRecord, attempts: int, now: datetime) -> Artifacts:
    """One attempt, started at `now`; returns the artifacts to record. Never raises for
    a failed retrieval: every error becomes a recorded failure, whose backoff counts
    from when it failed (a long transfer that broke is not due at once)."""
    settings = ctx.settings
    dest = settings.artifacts_root / run.id
    started = time.monotonic()
    try:
        entries, exclude = retrieval_plan(run.state, run.snapshot)
        # Complete and intact already (a retry after the record's update was lost, or
        # `force`): no need to reach the target, which may be gone.
        done = reuse_stored(dest, run.id)  # a copy made for another run is moved aside
        if done is None:
            executor = ctx.executor(run.target)
            limits = ArtifactLimits.of(settings)
            done = retrieve(
                executor, run.remote_dir, dest, entries, exclude, run_id=run.id, limits=limits
            )
    except Exception as error:
        if not isinstance(error, (RetrievalError, ExecError, RunError, OSError)):
            log.exception("run %s: retrieval failed unexpectedly", run.id)
        text = str(error)[:500] or type(error).__name__
        if isinstance(error, ArtifactQuotaExceeded):
            # A person must free space or raise a limit: failed now, not tried again
            # by itself (`runwarden retrieve` does, when asked).
            log.error("run %s: artifacts NOT retrieved: %s", run.id, text)
            return Artifacts(phase=ArtifactsPhase.FAILED, attempts=attempts, error=text)
        if attempts >= settings.retrieve_attempts:
            log.error(
                "run %s: artifacts NOT retrieved after %d attempts: %s", run.id, attempts, text
            )
            return Artifacts(phase=ArtifactsPhase.FAILED, attempts=attempts, error=text)
        wait_s = min(
            settings.retrieve_backoff_s * 2 ** (attempts - 1), settings.retrieve_backoff_max_s
        )
        if isinstance(error, RetrievalError) and not error.retryable:
            # Needs a person (a host key, a permission): try seldom.
            wait_s = settings.retrieve_backoff_max_s
        log.warning(
            "run %s: retrieval attempt %d failed, next in %g s: %s", run.id, attempts, wait_s, text
        )
        failed_at = now + timedelta(seconds=time.monotonic() - started)
        upcoming = failed_at + timedelta(seconds=wait_s)
        return Artifacts(attempts=attempts, error=text, next_attempt=upcoming)
    if run.snapshot is not None and run.snapshot.checkpoint in done.absent:
        # What the run's record promises is its checkpoint: a retrieval without it
        # (gone from the target, or a link there now) is no retrieval. Not tried again
        # by itself: the target holds no more; `runwarden retrieve` does, when asked.
        text = (
            f"the checkpoint {run.snapshot.checkpoint} did not come home: the target "
            "holds no regular file under it (missing, empty, or a symbolic link on its "
            f"path); what came is in {done.path}"
        )
        log.error("run %s: artifacts NOT retrieved: %s", run.id, text)
        return Artifacts(phase=ArtifactsPhase.FAILED, attempts=attempts, error=text)
    log.info(
        "run %s: artifacts retrieved and verified: %d files, %d bytes in %.1f s",
        run.id, done.files, done.bytes, time.monotonic() - started,
    )  # fmt: skip
    if done.skipped_links:
        log.warning(
            "run %s: %d symbolic link(s) leading outside the run directory left out, "
            "listed in %s/manifest.json",
            run.id, len(done.skipped_links), done.path,
        )  # fmt: skip
    return Artifacts(
        phase=ArtifactsPhase.DONE,
        attempts=attempts,
        path=str(done.path),
        files=done.files,
        bytes=done.bytes,
        skipped_links=len(done.skipped_links),
        retrieved=utcnow(),
    )
