"""What the tasks do to runs, apart from Celery: launch, finish, stop deadlines,
the per-target watch. Every function re-reads the state it acts on and changes it
by compare-and-set, so a duplicate, late or concurrent call changes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import secrets as _secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import SecretStr

from schemas import (
    Conflict,
    JobCommand,
    JobId,
    JobStatus,
    NotFound,
    NotRunning,
    Outcome,
    ProofNone,
    RunRecord,
    RunState,
    Settings,
    SnapshotReason,
    StopPhase,
    StopState,
    StoreError,
    decide_outcome,
    new_run_id,
    next_run_id,
    parse_proof,
    validate_run_id,
)
from schemas.events import TASK_END_TIMEOUT, TASK_PROOF_TIMEOUT, LaunchSpec
from schemas.protocol import (
    JOBSIDE_DIR,
    METRICS_FILE,
    PID_FILE,
    PROOF_LIMIT,
    SNAPSHOT_FILE,
    SNAPSHOT_REQUEST,
)
from schemas.run import check_cancel, check_snapshot_request
from schemas.store import Offsets, RunStore

from .errors import LaunchError, SecretMissing, WorkerError
from .executors import ExecError, ScriptExecutor
from .executors.lines import complete_lines
from .executors.scripts import FOLLOW_CHUNK_BYTES, follow_script, parse_follow
from .jobside import jobside_dir
from .targets import executor_for

__all__ = [
    "Scheduler",
    "Worker",
]

log = logging.getLogger("runwarden")

SECRET_ENV_PREFIX = "RUNWARDEN_SECRET_"  # noqa: S105 - a name prefix, not a secret
CLAIM_TRIES = 20
CANCEL_RETRY_S = 60.0
"""When a cancel failed (the group survived, the target was unreachable), how long
until `reconcile` tries it again, in seconds."""


Scheduler = Callable[[str, dict[str, Any], float], None]
"""Sends task `name` with body `kwargs["body"]` after a countdown in seconds."""


@dataclass
class Worker:
    """The run operations of one worker process: the store, the settings, and how to
    schedule a countdown task."""

    store: RunStore
    settings: Settings
    schedule: Scheduler
    worker_id: str = ""

    def __post_init__(self) -> None:
        self.worker_id = self.worker_id or f"{os.uname().nodename}:{os.getpid()}"

    def executor(self, target: str) -> ScriptExecutor:
        return executor_for(self.store, target)

    # --- launch ---------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, now: datetime) -> RunRecord:
        """Claims a run directory (a taken one tries the next id), records the run,
        uploads, ships the job side, spawns, records it running and follows it. If the
        record cannot be written after the spawn, the job is cancelled: nothing could
        find it again.

        Raises:
            UnknownTarget, LaunchError, SecretMissing, ExecError, StoreError.
        """
        if spec.resume_from is not None:
            raise LaunchError("resume is not available yet (issue 6)")
        secrets = {}
        for name in spec.secrets:
            value = os.environ.get(SECRET_ENV_PREFIX + name)
            if value is None:
                raise SecretMissing(name)
            secrets[name] = SecretStr(value)
        executor = self.executor(spec.target)
        run_id = new_run_id(spec.name, now)
        owner = f"{run_id} {_secrets.token_hex(8)}"
        for _ in range(CLAIM_TRIES):
            run_dir = f"{executor.workdir}/{run_id}"
            record = RunRecord(
                id=run_id,
                target=spec.target,
                created=now,
                remote_dir=run_dir,
                state=RunState.PREPARING,
                snapshots=spec.snapshots,
                command=spec.command,
                limits=spec.limits,
            )
            if self.store.create_run(record):
                if executor.claim(run_dir, owner):
                    break
                self.store.transition(run_id, RunState.FAILED, message="run directory taken")
            run_id = next_run_id(run_id)
            owner = f"{run_id} {_secrets.token_hex(8)}"
        else:
            raise LaunchError(f"no free run directory after {CLAIM_TRIES} tries")
        try:
            if spec.upload is not None:
                executor.upload(spec.upload, run_dir, spec.skip)
            executor.upload(
                jobside_dir(), f"{run_dir}/{JOBSIDE_DIR}", ["__init__.py", "__pycache__"]
            )
            env = {
                "PYTHONPATH": f"{run_dir}/{JOBSIDE_DIR}",
                "RUNWARDEN_RUN_ID": run_id,
                "RUNWARDEN_SNAPSHOT_REQUEST": f"{run_dir}/{SNAPSHOT_REQUEST}",
                "RUNWARDEN_METRICS": f"{run_dir}/{METRICS_FILE}",
            }
            job = executor.spawn(
                JobCommand(dir=run_dir, script=spec.command, env=env, secrets=secrets)
            )
        except (ExecError, OSError) as error:
            self.store.transition(run_id, RunState.FAILED, message=f"launch failed: {error}")
            raise
        try:
            record = self.store.transition(run_id, RunState.RUNNING, job=job)
            self.store.follow(run_id)
        except Exception:
            log.exception("run %s: cannot record its job; cancelling it", run_id)
            executor.cancel(job)
            raise
        log.info("run %s: launched on %s, pid %s", run_id, spec.target, job.pid)
        return record

    def adopt(self, target: str, run_dir: str, now: datetime) -> RunRecord:
        """Follows a run directory started elsewhere (by hand, or by overbrainer): its
        pid from `job.pid`; its id from the directory's name when that is a free run
        id, else a new one.

        Raises:
            LaunchError: when the directory holds no usable `job.pid`.
        """
        executor = self.executor(target)
        raw = executor.read_from(f"{run_dir}/{PID_FILE}", 0, 32).decode("ascii", "replace")
        try:
            job = JobId(dir=run_dir, pid=int(raw.strip()))
        except ValueError as error:
            raise LaunchError(f"{run_dir} holds no valid {PID_FILE}") from error
        name = run_dir.rstrip("/").rsplit("/", 1)[-1]
        try:
            run_id = validate_run_id(name)
        except ValueError:
            run_id = new_run_id(name, now)
        record = RunRecord(
            id=run_id,
            target=target,
            created=now,
            remote_dir=run_dir,
            job=job,
            state=RunState.RUNNING,
            command="(adopted)",
        )
        while not self.store.create_run(record):
            record = record.model_copy(update={"id": next_run_id(record.id)})
        self.store.follow(record.id)
        return record

    # --- ending ---------------------------------------------------------------------

    def finish(self, run: RunRecord, status: JobStatus, executor: ScriptExecutor) -> RunRecord:
        """Records how `run` ended (DESIGN.md §3), closes its stop, clears its deadlines
        and stops following it. A run already ended keeps its state."""
        proof = None
        if status.kind == "cancelled" or status == JobStatus.exited(0):
            try:
                proof = parse_proof(
                    executor.read_from(f"{run.remote_dir}/{SNAPSHOT_FILE}", 0, PROOF_LIMIT)
                )
            except ExecError as error:
                log.warning("run %s: cannot read its proof: %s", run.id, error)
        outcome: Outcome = decide_outcome(status, proof)
        try:
            record, changed = self.store.apply_transition(
                run.id, outcome.state, message=outcome.message, snapshot=outcome.snapshot
            )
        except Conflict as error:
            log.info("run %s: already ended: %s", run.id, error)
            record, changed = self.store.get_run(run.id), False
        if changed:
            log.info("run %s: %s (%s)", run.id, record.state, record.message or "")
        self.store.close_stop(run.id, None, note=f"the run ended {record.state}")
        self.store.unfollow(run.id)
        return record

    # --- stops ----------------------------------------------------------------------

    def request_snapshot(
        self, run_id: str, reason: SnapshotReason, asked_by: str, now: datetime
    ) -> StopState:
        """Asks the run's job for a snapshot: opens the stop (its proof deadline in the
        deadline table first), then writes the request; schedules the proof countdown
        for a new stop. Asking again changes only the reason, never the timers.

        Raises:
            NotFound, NotStarted, NotRunning, NoSnapshots, ExecError, StoreError.
        """
        run = self.store.get_run(run_id)
        check_snapshot_request(run)
        stop, opened = self.store.open_stop(
            run_id, reason, asked_by, now, self.settings.proof_timeout_s, replace_reason=True
        )
        try:
            self.executor(run.target).put_file(
                f"{run.remote_dir}/{SNAPSHOT_REQUEST}", str(stop.reason)
            )
        except ExecError:
            if opened:
                # Never asked: a proof deadline would cancel a job that was not told.
                self.store.close_stop(run_id, stop.stop_id, note="the request could not be written")
            raise
        if opened:
            self.schedule_deadline(stop, "proof", self.settings.proof_timeout_s)
            log.info("run %s: snapshot asked (%s, by %s)", run_id, stop.reason, asked_by)
        return stop

    def notice_request(self, run: RunRecord, reason: str, now: datetime) -> None:
        """A request someone else wrote in the run directory: opens a stop for it, as if
        asked here (the first reason stays)."""
        if not run.snapshots:
            return
        try:
            stop, opened = self.store.open_stop(
                run.id, SnapshotReason.parse(reason), "watch", now, self.settings.proof_timeout_s
            )
        except NotRunning:
            return  # it ended since this tick read it
        if opened:
            self.schedule_deadline(stop, "proof", self.settings.proof_timeout_s)
            log.info("run %s: found a snapshot request (%s)", run.id, stop.reason)

    def schedule_deadline(self, stop: StopState, kind: str, countdown_s: float) -> None:
        name = TASK_PROOF_TIMEOUT if kind == "proof" else TASK_END_TIMEOUT
        body = {"run_id": stop.run_id, "stop_id": stop.stop_id}
        try:
            self.schedule(name, {"body": body}, countdown_s)
        except Exception:  # noqa: BLE001 - reconcile fires it from the deadline table
            log.warning("run %s: cannot schedule the %s countdown", stop.run_id, kind)

    def on_deadline(self, run_id: str, stop_id: str, now: datetime) -> str:
        """Acts on the stop `stop_id` of `run_id` whose deadline may have come: the
        proof deadline cancels a job still running without a proof (one with a proof
        gets the end deadline); the end deadline cancels a job still running; a
        cancel that failed is retried. Returns what it did, for the task's result.
        A stale or early call changes nothing."""
        stop = self.store.get_stop(run_id)
        if stop is None or stop.stop_id != stop_id:
            return "stale"
        if stop.phase is StopPhase.CANCELLING:
            # Another task is cancelling the job, or died doing it: retry only once
            # the retry deadline has come, and only the task that re-arms it.
            retry = stop.end_deadline
            if retry is not None and now < retry - timedelta(seconds=0.5):
                return "cancelling"
            moved = self.store.advance_stop(
                run_id,
                stop_id,
                StopPhase.CANCELLING,
                StopPhase.CANCELLING,
                end_deadline=now + timedelta(seconds=CANCEL_RETRY_S),
                note="retrying the cancel",
            )
            if moved is None:
                return "stale"
            return self._cancel_for(moved, now)
        due = stop.proof_deadline if stop.phase is StopPhase.WAITING_PROOF else stop.end_deadline
        if due is not None and now < due - timedelta(seconds=0.5):
            return "early"
        run = self.store.get_run(run_id)
        if run.job is None or run.state.is_terminal:
            self.store.close_stop(run_id, stop_id, note="the run is not running")
            return "ended"
        executor = self.executor(run.target)
        status = executor.status(run.job)
        if status.is_finished:
            self.finish(run, status, executor)
            return "ended"
        if stop.phase is StopPhase.WAITING_PROOF:
            proof = parse_proof(
                executor.read_from(f"{run.remote_dir}/{SNAPSHOT_FILE}", 0, PROOF_LIMIT)
            )
            if not isinstance(proof, ProofNone):
                end = now + timedelta(seconds=self.settings.end_timeout_s)
                moved = self.store.advance_stop(
                    run_id,
                    stop_id,
                    StopPhase.WAITING_PROOF,
                    StopPhase.WAITING_END,
                    end_deadline=end,
                    note="proof seen: waiting for the job to end",
                )
                if moved is not None:
                    self.schedule_deadline(moved, "end", self.settings.end_timeout_s)
                return "proved"
            note = (
                f"no snapshot {self.settings.proof_timeout_s:g} s after it was asked for: "
                "cancelling the job"
            )
        else:
            note = "the job saved its snapshot but did not end: cancelling it"
        moved = self.store.advance_stop(
            run_id,
            stop_id,
            stop.phase,
            StopPhase.CANCELLING,
            end_deadline=now + timedelta(seconds=CANCEL_RETRY_S),
            note=note,
        )
        if moved is None:
            return "stale"
        log.warning("run %s: %s", run_id, note)
        return self._cancel_for(moved, now)

    def _cancel_for(self, stop: StopState, now: datetime) -> str:
        run = self.store.get_run(stop.run_id)
        if run.job is None or run.state.is_terminal:
            self.store.close_stop(run.id, stop.stop_id, note="the run is not running")
            return "ended"
        try:
            record = self._cancel_once(run, run.job)
        except ExecError as error:
            log.warning("run %s: cancel failed, retried in %g s: %s", run.id, CANCEL_RETRY_S, error)
            return "cancel failed"
        return "cancelled" if record.state.is_terminal else "cancelling"

    def _cancel_once(self, run: RunRecord, job: JobId) -> RunRecord:
        """Cancels the run's job unless another task is cancelling it right now (one
        marker per run in the store, for as long as a cancel may take), so the job
        is signalled once; the other task waits for the outcome and returns the run
        as recorded then.

        Raises:
            ExecError: the cancel failed (the marker is dropped: a retry may try).
        """
        key = f"cancel:{run.id}"
        if not self.store.once(key, ttl_s=CANCEL_RETRY_S):
            deadline = time.monotonic() + CANCEL_RETRY_S
            record = self.store.get_run(run.id)
            while not record.state.is_terminal and time.monotonic() < deadline:
                time.sleep(0.2)
                record = self.store.get_run(run.id)
            return record
        executor = self.executor(run.target)
        try:
            executor.cancel(job)
            status = executor.status(job)
        except ExecError:
            self.store.forget(key)
            raise
        return self.finish(run, status, executor)

    def cancel(self, run_id: str) -> RunRecord:
        """Cancels the run's job now (the seeds' cancel) and records the outcome.

        Raises:
            NotFound, NotStarted, NotRunning, ExecError, StoreError.
        """
        run = self.store.get_run(run_id)
        return self._cancel_once(run, check_cancel(run))

    def reconcile(self, now: datetime, limit: int = 200) -> int:
        """Fires every overdue deadline whose countdown did not (a worker killed, a
        message lost); returns how many it acted on."""
        done = 0
        for deadline in self.store.due_deadlines(now, limit):
            if not self.store.claim_deadline(
                deadline, self.worker_id, self.settings.deadline_lease_s
            ):
                continue
            try:
                self.on_deadline(deadline.run_id, deadline.stop_id, now)
                done += 1
            except Exception:
                log.exception("run %s: deadline failed", deadline.run_id)
        return done

    # --- the watch ------------------------------------------------------------------

    def _records(self, run_ids: list[str]) -> list[RunRecord | None]:
        """The records of `run_ids` in one round trip; an unreadable one is logged and
        read as missing (it must not stop the others)."""
        try:
            return self.store.get_runs(run_ids)
        except StoreError:
            found: list[RunRecord | None] = []
            for run_id in run_ids:
                try:
                    found.append(self.store.get_run(run_id))
                except (StoreError, NotFound):
                    log.exception("run %s: unreadable; no longer followed", run_id)
                    found.append(None)
            return found

    def watch_target(self, target: str, now: datetime) -> dict[str, int]:
        """One tick over every followed run of `target`: one batched script for their
        statuses, new log and metrics bytes and snapshot requests; records lines,
        opens stops for requests someone else wrote, finishes runs that ended."""
        ids = self.store.followed(target)
        runs: list[RunRecord] = []
        for run_id, found in zip(ids, self._records(ids), strict=True):
            if found is None or found.job is None or found.state.is_terminal:
                self.store.unfollow(run_id)
                continue
            runs.append(found)
        if not runs:
            return {"runs": 0}
        executor = self.executor(target)
        offsets = self.store.get_offsets_many([run.id for run in runs])
        token = _secrets.token_hex(16)
        entries = [
            (run.job, o.log, o.metrics)
            for run, o in zip(runs, offsets, strict=True)
            if run.job is not None
        ]
        result = executor.transport.run(follow_script(entries, token), action="follow")
        if result.exit_code != 0:
            raise WorkerError(f"follow script failed on {target}: {result.stderr[:300]!r}")
        updates = parse_follow(result.stdout, token, len(runs))
        ended = 0
        for run, offset, update in zip(runs, offsets, updates, strict=True):
            lines, used_log = _lines(update.log)
            records, used_metrics = _records(update.metrics)
            if used_log or used_metrics:
                self.store.record_tail(
                    run.id,
                    lines=lines,
                    records=records,
                    from_offsets=offset,
                    to_offsets=Offsets(offset.log + used_log, offset.metrics + used_metrics),
                )
            if update.request is not None and self.store.get_stop(run.id) is None:
                self.notice_request(run, update.request, now)
            if isinstance(update.status, JobStatus) and update.status.is_finished:
                self.finish(run, update.status, executor)
                ended += 1
            elif not isinstance(update.status, JobStatus):
                log.warning("run %s: %s", run.id, update.status)
        return {"runs": len(runs), "ended": ended}


def _lines(chunk: bytes) -> tuple[list[str], int]:
    cap = FOLLOW_CHUNK_BYTES - 1 if len(chunk) >= FOLLOW_CHUNK_BYTES else None
    lines, used, _ = complete_lines(chunk, cap=cap)
    return lines, used


def _records(chunk: bytes) -> tuple[list[dict[str, Any]], int]:
    lines, used = _lines(chunk)
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, used


def utcnow() -> datetime:
    return datetime.now(UTC)
