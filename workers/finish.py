"""The end of a run: how a finished job's run is recorded (the outcome rules of
`schemas.run.decide_outcome`), its stop closed, its follow stopped and its artifacts'
retrieval sent."""

from __future__ import annotations

import logging

from schemas import (
    Conflict,
    JobStatus,
    ProofInvalid,
    RunRecord,
    decide_outcome,
    parse_proof,
)
from schemas.ledger import RunEnded
from schemas.protocol import PROOF_LIMIT, SNAPSHOT_FILE
from schemas.snapshot import Proof

from .artifacts import queue_retrieval
from .budgets import record_stop_save
from .context import Context, utcnow
from .executors import ExecError, Executor, ProtocolError
from .job_end import read_job_end
from .notify import emit

log = logging.getLogger("runwarden")

__all__ = ["finish", "read_proof"]


def read_proof(executor: Executor, run: RunRecord) -> Proof | None:
    """What the run's `snapshot.json` says (at most its first 64 KiB): a file the job
    put there that is not a regular file (a directory, a FIFO, a link) is an invalid
    proof, saying why; None when the target could not be read (logged)."""
    try:
        content = executor.read_from(f"{run.remote_dir}/{SNAPSHOT_FILE}", 0, PROOF_LIMIT)
    except ProtocolError as error:
        return ProofInvalid(why=f"{SNAPSHOT_FILE} cannot be read ({error})")
    except ExecError as error:
        log.warning("run %s: cannot read its proof: %s", run.id, error)
        return None
    return parse_proof(content)


def finish(ctx: Context, run: RunRecord, status: JobStatus, executor: Executor) -> RunRecord:
    """Records how `run` ended (its outcome from `status` and its proof, read once
    from the target: a proof is never thrown away) and, in the same transaction, closes
    its stop (its deadlines cleared) and stops following it; the first to record the
    end sends the retrieval, and records how long a stop that proved took
    (`workers.budgets.record_stop_save`). A run already ended keeps its state.
    Returns the stored record."""
    outcome = decide_outcome(status, read_proof(executor, run), read_job_end(executor, run, status))
    note = f"the run ended {outcome.state}"
    stop = ctx.store.get_stop(run.id)  # read before the end closes it: its save time
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
        record_stop_save(ctx, stop, outcome.snapshot is not None, utcnow())
        emit(ctx, RunEnded.of, record, utcnow())
        queue_retrieval(ctx, record)
    return record
