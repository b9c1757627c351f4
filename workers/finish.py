"""The end of a run: how a finished job's run is recorded (the outcome rules of
`schemas.run.decide_outcome`), its stop closed, its follow stopped and its artifacts'
retrieval sent."""

from __future__ import annotations

import logging

from schemas import Conflict, JobStatus, RunRecord, decide_outcome, parse_proof
from schemas.protocol import PROOF_LIMIT, SNAPSHOT_FILE

from .artifacts import queue_retrieval
from .context import Context
from .executors import ExecError, Executor

log = logging.getLogger("runwarden")

__all__ = ["finish"]


def finish(ctx: Context, run: RunRecord, status: JobStatus, executor: Executor) -> RunRecord:
    """Records how `run` ended (its outcome from `status` and, for an exit 0 or a
    cancel, its proof read once from the target) and, in the same transaction, closes
    its stop (its deadlines cleared) and stops following it; the first to record the
    end sends the retrieval. A run already ended keeps its state. Returns the stored
    record."""
    proof = None
    if status.kind == "cancelled" or status == JobStatus.exited(0):
        try:
            proof = parse_proof(
                executor.read_from(f"{run.remote_dir}/{SNAPSHOT_FILE}", 0, PROOF_LIMIT)
            )
        except ExecError as error:
            log.warning("run %s: cannot read its proof: %s", run.id, error)
    outcome = decide_outcome(status, proof)
    note = f"the run ended {outcome.state}"
    try:
        record, changed = ctx.store.end_run(
            run.id, outcome.state, message=outcome.message, snapshot=outcome.snapshot, note=note
        )
    except Conflict as error:
        # Ended otherwise by another worker: its stop and follow close as it ended.
        log.info("run %s: already ended: %s", run.id, error)
        record, changed = ctx.store.get_run(run.id), False
        ctx.store.close_stop(run.id, None, note=f"the run ended {record.state}")
        ctx.store.unfollow(run.id)
    if changed:
        log.info("run %s: %s (%s)", run.id, record.state, record.message or "")
        queue_retrieval(ctx, record)
    return record
