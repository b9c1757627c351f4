"""The end of a run: how a finished job's run is recorded (the outcome rules of
`schemas.run.decide_outcome`), its stop closed, its follow stopped and its artifacts'
retrieval sent."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from schemas import (
    ArtifactsPhase,
    Conflict,
    JobStatus,
    ProofInvalid,
    ProofSaved,
    RunRecord,
    StopPhase,
    decide_outcome,
    parse_proof,
)
from schemas.events import TASK_RETRIEVE
from schemas.ledger import ProofSeen, RunEnded
from schemas.protocol import PROOF_LIMIT, SNAPSHOT_FILE
from schemas.snapshot import Proof, proof_moment
from store.steps import end_run

from .budgets import record_stop_save
from .cancel_mark import cancelling_now
from .context import Context, utcnow
from .executors import ExecError, Executor, ProtocolError
from .job_end import read_job_end
from .notify import emit

log = logging.getLogger("runwarden")

__all__ = ["finish", "judge_proofs", "queue_retrieval", "read_proof"]


def queue_retrieval(ctx: Context, run: RunRecord) -> None:
    """Sends the retrieval task of the ended `run` (`workers.artifacts`). The retrieval
    itself was queued durably by the transition that ended the run (the store's
    retrieval queue, which `reconcile` drains), so a failure to send loses nothing."""
    if run.artifacts is not None and run.artifacts.phase is ArtifactsPhase.PENDING:
        ctx.send(TASK_RETRIEVE, run.id)


def read_proof(executor: Executor, run: RunRecord, content: bytes | None = None) -> Proof | None:
    """What the run's `snapshot.json` says (at most its first 64 KiB; `content` when
    the follow tick read it already, else read now), its checkpoint judged on the
    target by the one rule ([`judge_proofs`]): a file the job put there that is not a
    regular file (a directory, a FIFO, a link), or a checkpoint that is not a real
    directory in the run directory, is an invalid proof, saying why; None when the
    target could not be read (logged)."""
    if content is None:
        try:
            content = executor.read_from(f"{run.remote_dir}/{SNAPSHOT_FILE}", 0, PROOF_LIMIT)
        except ProtocolError as error:
            return ProofInvalid(why=f"{SNAPSHOT_FILE} cannot be read ({error})")
        except ExecError as error:
            log.warning("run %s: cannot read its proof: %s", run.id, error)
            return None
    return judge_proofs(executor, [(run, parse_proof(content))])[0]


def judge_proofs(
    executor: Executor, proofs: Sequence[tuple[RunRecord, Proof | None]]
) -> list[Proof | None]:
    """`proofs` (runs of `executor`'s target, each with its parsed proof) with every
    valid proof's checkpoint judged in one script on the target
    (`Executor.check_checkpoints`: with no symbolic link on its path, a non-empty
    directory inside the run directory): one that fails is a `ProofInvalid` saying
    why; one that could not be judged (the target unreachable, a garbled answer) is
    None, logged, as a proof that could not be read. Anything but a valid proof is
    returned as it is."""
    saved = [
        (index, run, proof)
        for index, (run, proof) in enumerate(proofs)
        if isinstance(proof, ProofSaved)
    ]
    judged: list[Proof | None] = [proof for _, proof in proofs]
    if not saved:
        return judged
    try:
        verdicts = executor.check_checkpoints(
            [(run.remote_dir, proof.snapshot.checkpoint) for _, run, proof in saved]
        )
    except ExecError as error:
        log.warning("cannot judge the checkpoints of %d proof(s): %s", len(saved), error)
        for index, _, _ in saved:
            judged[index] = None
        return judged
    for (index, _, _), why in zip(saved, verdicts, strict=True):
        if why is not None:
            judged[index] = ProofInvalid(why=why)
    return judged


def _release(ctx: Context, executor: Executor, run: RunRecord) -> None:
    """Ends what is left of the run's job, in its cgroup and carrying its mark, before
    its end is recorded (`Executor.release`), unless a cancel is under way: that one
    ends them itself, each process with its SIGTERM and grace, and records the end
    after. So a cancel whose worker died half-way (its marker lapsed) leaves no
    process behind the end another task records. A failure is logged, never in the
    way of the end."""
    job = run.job
    if job is None or (job.cgroup is None and job.mark is None) or cancelling_now(ctx, run.id):
        return
    try:
        executor.release(job)
    except ExecError as error:
        log.warning("run %s: what is left of its job could not be ended: %s", run.id, error)


def finish(
    ctx: Context,
    run: RunRecord,
    status: JobStatus,
    executor: Executor,
    *,
    proof: bytes | None = None,
    job_end: bytes | None = None,
) -> RunRecord:
    """Records how `run` ended (its outcome from `status` and its proof, read once
    from the target: a proof is never thrown away; `proof` and `job_end` are their
    bytes when the follow tick that saw the end read them, see
    `FollowUpdate.final_proof` and `job_end`) and, in the same transaction, closes
    its stop (its deadlines cleared) and stops following it; the first to record the
    end sends the retrieval, and records how long a stop that proved took
    (`workers.budgets.record_stop_save`) and, for a stop whose proof no one saw
    before, tells the proof (`proof_seen` by the end, written at its own time bounded
    by the request and now). A run already ended keeps its state. Returns the stored
    record."""
    proved = read_proof(executor, run, proof)
    seen = utcnow()  # the proof read was there by now
    outcome = decide_outcome(status, proved, read_job_end(executor, run, status, job_end))
    _release(ctx, executor, run)
    note = f"the run ended {outcome.state}"
    stop = ctx.store.stops.get(run.id)  # read before the end closes it: its save time
    try:
        record, changed = end_run(ctx.store,
            run.id, outcome.state, message=outcome.message, snapshot=outcome.snapshot, note=note
        )
    except Conflict as error:
        # Ended otherwise by another worker: its stop and follow close as it ended.
        log.info("run %s: already ended: %s", run.id, error)
        record, changed = ctx.store.runs.get(run.id), False
        ctx.store.stops.close(run.id, None, note=f"the run ended {record.state}")
        ctx.store.follow.remove(run.id)
    if changed:
        log.info("run %s: %s (%s)", run.id, record.state, record.message or "")
        record_stop_save(ctx, stop, outcome.snapshot is not None, seen)
        if (
            isinstance(proved, ProofSaved)
            and outcome.snapshot is not None
            and stop is not None
            and stop.phase is StopPhase.WAITING_PROOF
        ):
            proved_at = proof_moment(proved.time, stop.asked_at, seen)
            emit(ctx, ProofSeen.seen, stop, outcome.snapshot, proved_at, seen_at=seen, by="end")
        emit(ctx, RunEnded.of, record, utcnow())
        queue_retrieval(ctx, record)
    return record
