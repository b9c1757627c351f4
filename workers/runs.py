"""What the tasks do to runs, apart from Celery: launch, finish, stop deadlines,
the per-target watch. Every function re-reads the state it acts on and changes it
by compare-and-set, so a duplicate, late or concurrent call changes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import secrets as _secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import SecretStr

from schemas import (
    Artifacts,
    ArtifactsPhase,
    Conflict,
    JobCommand,
    JobId,
    JobStatus,
    NotFound,
    NotResumable,
    NotRunning,
    Outcome,
    ProofNone,
    RunError,
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
from schemas.events import (
    TASK_END_TIMEOUT,
    TASK_PROOF_TIMEOUT,
    TASK_RETRIEVE,
    TASK_SNAPSHOT_REQUEST,
    LaunchSpec,
)
from schemas.policy import PolicyVerdict, deadline_request_after_s, time_verdict
from schemas.protocol import (
    JOBSIDE_DIR,
    METRICS_FILE,
    PID_FILE,
    PROOF_LIMIT,
    RESUME_ENV,
    SNAPSHOT_FILE,
    SNAPSHOT_REQUEST,
)
from schemas.run import (
    ADOPTED_COMMAND,
    check_cancel,
    check_resumable,
    check_snapshot_request,
)
from schemas.store import Offsets, RunStore

from .errors import LaunchError, SecretMissing, WorkerError
from .executors import ExecError, ScriptExecutor
from .executors.digest import FileDigest
from .executors.lines import complete_lines
from .executors.probe import disk_probe_script, disk_verdict, parse_disk_probe
from .executors.scripts import FOLLOW_CHUNK_BYTES, follow_script, parse_follow
from .jobside import jobside_dir
from .retrieval import (
    RetrievalError,
    check_stored,
    retrieval_plan,
    retrieve,
    reuse_stored,
)
from .targets import executor_for

__all__ = [
    "Scheduler",
    "Worker",
]

log = logging.getLogger("runwarden")

SECRET_ENV_PREFIX = "RUNWARDEN_SECRET_"  # noqa: S105 - a name prefix, not a secret
CLAIM_TRIES = 20
RETRIEVE_RESEND_S = 3600.0
"""When reconcile sent a due retrieval, how long until it sends it again if the task
has not started by then (it waits behind long ones on its queue; a duplicate is a
no-op, a lost message costs at most this long)."""
RETRIEVE_LEASE_S = 120.0
"""How long a retrieval's lock lasts without its worker extending it, in seconds."""
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
        uploads, ships the job side, spawns (with the on-target watchdog when the run
        has `max_hours` and reads snapshot requests), records it running and follows
        it. If the record cannot be written after the spawn, the job is cancelled:
        nothing could find it again.

        A resume (`spec.resume_from`) first checks that the run is stopped and its
        checkpoint is intact in the artifact store (else `NotResumable`, nothing
        claimed), then uploads that checkpoint to the same relative path in the new
        run directory, checks the upload against the stored manifest, and passes its
        absolute path as `RUNWARDEN_RESUME_FROM`. The spawn removes a stale
        `snapshot.request` or `snapshot.json` (from the uploaded directory), so the
        new run never inherits a request.

        Raises:
            UnknownTarget, NotFound, NotResumable, LaunchError, SecretMissing,
            ExecError, StoreError.
        """
        resume: tuple[RunRecord, str, list[FileDigest]] | None = None
        if spec.resume_from is not None:
            resume = self.resumable(spec.resume_from)
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
                name=spec.name,
                upload=None if spec.upload is None else str(spec.upload),
                skip=spec.skip,
                secrets=spec.secrets,
                resumed_from=None if resume is None else resume[0].id,
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
            if resume is not None:
                env[RESUME_ENV] = self._upload_checkpoint(executor, run_dir, *resume)
            after_s = deadline_request_after_s(spec.limits, self.settings.deadline_lead_s)
            job = executor.spawn(
                JobCommand(
                    dir=run_dir,
                    script=spec.command,
                    env=env,
                    secrets=secrets,
                    deadline_request_after_s=(
                        None if after_s is None or not spec.snapshots else max(after_s, 0.001)
                    ),
                    watchdog_poll_s=self.settings.watchdog_poll_s,
                )
            )
        except Exception as error:
            # Also the task's soft time limit (an Exception): a run never stays
            # `preparing`.
            text = str(error) or type(error).__name__
            try:
                self.store.transition(run_id, RunState.FAILED, message=f"launch failed: {text}")
            except Exception:
                log.exception("run %s: cannot record its failed launch", run_id)
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

    def resumable(self, run_id: str) -> tuple[RunRecord, str, list[FileDigest]]:
        """The stopped run `run_id`, its checkpoint (relative to the run directory)
        and the stored digests of the checkpoint's files, when it can be resumed.

        Raises:
            NotFound: no such run.
            NotResumable: it is not stopped, or its checkpoint is not complete in
                the artifact store (not retrieved yet, retrieval failed, files
                missing or changed in size).
        """
        source = self.store.get_run(run_id)
        snapshot = check_resumable(source)
        checkpoint = snapshot.checkpoint
        try:
            files = check_stored(self.settings.artifacts_root / source.id, checkpoint)
        except RetrievalError as error:
            raise NotResumable(run_id, str(error)) from error
        return source, checkpoint, files

    def _upload_checkpoint(
        self,
        executor: ScriptExecutor,
        run_dir: str,
        source: RunRecord,
        checkpoint: str,
        files: list[FileDigest],
    ) -> str:
        """Uploads the stored checkpoint of `source` to `<run_dir>/<checkpoint>` and
        checks every file against the stored digests; returns the remote path.

        Raises:
            LaunchError: the upload differs from the artifact store.
            ExecError: the upload failed.
        """
        local = self.settings.artifacts_root / source.id / checkpoint
        remote = f"{run_dir}/{checkpoint}"
        executor.upload(local, remote)
        uploaded = {d.path: d.sha256 for d in executor.manifest(run_dir, [checkpoint])}
        stored = {d.path: d.sha256 for d in files}
        if uploaded != stored:
            wrong = sorted(set(uploaded.items()) ^ set(stored.items()))
            raise LaunchError(
                f"the checkpoint of {source.id} arrived different on the target "
                f"({len(wrong)} differences, first {wrong[0][0]!r})"
            )
        log.info("run %s: checkpoint %s uploaded and verified", source.id, checkpoint)
        return remote

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
            command=ADOPTED_COMMAND,
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
        if changed:
            self.queue_retrieval(record)
        return record

    # --- artifacts ------------------------------------------------------------------

    def queue_retrieval(self, run: RunRecord) -> None:
        """Sends the retrieval task of the ended `run`. The retrieval itself was queued
        durably by the transition that ended the run (the store's retrieval queue,
        which `reconcile` drains), so a failure to send loses nothing."""
        if run.artifacts is not None and run.artifacts.phase is ArtifactsPhase.PENDING:
            self._send_retrieve(run.id)

    def _send_retrieve(self, run_id: str) -> None:
        try:
            self.schedule(TASK_RETRIEVE, {"body": {"run_id": run_id}}, 0.0)
        except Exception:  # noqa: BLE001 - reconcile sends it from the retrieval queue
            log.warning("run %s: cannot send the retrieval task", run_id)

    @staticmethod
    def _due(run: RunRecord, now: datetime) -> bool:
        artifacts = run.artifacts
        if artifacts is None:
            return run.job is not None
        if artifacts.phase is not ArtifactsPhase.PENDING:
            return False
        return artifacts.next_attempt is None or artifacts.next_attempt <= now + timedelta(
            seconds=1
        )

    def retrieve(self, run_id: str, now: datetime, *, force: bool = False) -> Artifacts:
        """Brings the artifacts of the ended run `run_id` into the artifact store,
        verified against the target's manifest (`workers.retrieval.retrieve`), and
        records the result. The attempt is counted before it starts (a worker killed
        mid-way still counts it); a failure is recorded with its error and tried
        again after a backoff (`retrieve_backoff_s`, doubled each time, at most
        `retrieve_backoff_max_s`; the maximum at once for an error that needs a
        person) until `retrieve_attempts`, then marked failed: never dropped
        silently. A call before the next attempt is due, or for a retrieval done or
        given up, changes nothing (a duplicate task). `force` (a person's
        `runwarden retrieve`) tries now, whatever the state. A stored copy that lost
        a file or changed a file's size is moved aside and retrieved again. One retrieval of a run
        runs at a time, under a lock held by its holder only.

        Raises:
            NotFound: no such run.
            Conflict: the run has not ended, or (with `force`) a retrieval of it is
                running now.
        """
        run = self.store.get_run(run_id)
        if not run.state.is_terminal:
            raise Conflict(f"run {run_id!r} is {run.state}: its artifacts come when it ends")
        if not force and not self._due(run, now):
            return run.artifacts or Artifacts(phase=ArtifactsPhase.FAILED, error="no job")
        lock, token = f"retrieve:{run_id}", _secrets.token_hex(16)
        if not self.store.lock(lock, token, RETRIEVE_LEASE_S):
            if force:
                raise Conflict(f"a retrieval of run {run_id!r} is running now")
            return run.artifacts or Artifacts()
        # While it runs, the lock and the queue entry are kept ahead of the clock,
        # so reconcile does not send it again; a worker killed mid-way lets both
        # lapse within a lease, and reconcile sends it again then.
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(RETRIEVE_LEASE_S / 4):
                try:
                    if not self.store.extend_lock(lock, token, RETRIEVE_LEASE_S):
                        log.error("run %s: the retrieval lock lapsed", run_id)
                        return
                    self.store.schedule_retrieval(
                        run_id, utcnow() + timedelta(seconds=RETRIEVE_LEASE_S)
                    )
                except Exception:  # noqa: BLE001 - Redis trouble: the lease may lapse
                    log.warning("run %s: cannot extend the retrieval lease", run_id)

        beat = threading.Thread(target=heartbeat, name=f"lease-{run_id}", daemon=True)
        try:
            run = self.store.get_run(run_id)  # as it is now that this call holds the lock
            if not force and not self._due(run, now):
                return run.artifacts or Artifacts()
            attempts = (run.artifacts.attempts if run.artifacts else 0) + 1
            previous = run.artifacts.error if run.artifacts else None
            lease_end = utcnow() + timedelta(seconds=RETRIEVE_LEASE_S)
            self.store.update_run(
                run_id,
                lambda current: current.model_copy(
                    update={
                        "artifacts": Artifacts(
                            attempts=attempts, error=previous, next_attempt=lease_end
                        )
                    }
                ),
            )
            beat.start()
            try:
                result = self._retrieve_once(run, attempts, now)
            finally:
                done.set()
                beat.join()

            def record(current: RunRecord) -> RunRecord | None:
                stored = current.artifacts
                if stored is not None and stored.phase is ArtifactsPhase.DONE and not force:
                    return None  # another retrieval finished meanwhile: keep it
                return current.model_copy(update={"artifacts": result})

            return self.store.update_run(run_id, record).artifacts or result
        finally:
            done.set()
            self.store.unlock(lock, token)

    def _retrieve_once(self, run: RunRecord, attempts: int, now: datetime) -> Artifacts:
        """One attempt, started at `now`; returns the artifacts to record. Never raises
        for a failed retrieval: every error becomes a recorded failure, whose backoff
        counts from when it failed (a long transfer that broke is not due at once)."""
        dest = self.settings.artifacts_root / run.id
        started = time.monotonic()
        try:
            entries, exclude = retrieval_plan(run.state, run.snapshot)
            # Complete and intact already (a retry after the record's update was
            # lost, or `force`): no need to reach the target, which may be gone.
            done = reuse_stored(dest)
            if done is None:
                executor = self.executor(run.target)
                done = retrieve(executor, run.remote_dir, dest, entries, exclude)
        except Exception as error:
            if not isinstance(error, (RetrievalError, ExecError, RunError, OSError)):
                log.exception("run %s: retrieval failed unexpectedly", run.id)
            text = str(error)[:500] or type(error).__name__
            if attempts >= self.settings.retrieve_attempts:
                log.error(
                    "run %s: artifacts NOT retrieved after %d attempts: %s",
                    run.id, attempts, text,
                )  # fmt: skip
                return Artifacts(phase=ArtifactsPhase.FAILED, attempts=attempts, error=text)
            wait_s = min(
                self.settings.retrieve_backoff_s * 2 ** (attempts - 1),
                self.settings.retrieve_backoff_max_s,
            )
            if isinstance(error, RetrievalError) and not error.retryable:
                # Needs a person (a host key, a permission): try seldom.
                wait_s = self.settings.retrieve_backoff_max_s
            log.warning(
                "run %s: retrieval attempt %d failed, next in %g s: %s",
                run.id, attempts, wait_s, text,
            )  # fmt: skip
            failed_at = now + timedelta(seconds=time.monotonic() - started)
            upcoming = failed_at + timedelta(seconds=wait_s)
            return Artifacts(attempts=attempts, error=text, next_attempt=upcoming)
        log.info(
            "run %s: artifacts retrieved and verified: %d files, %d bytes in %.1f s",
            run.id, done.files, done.bytes, time.monotonic() - started,
        )  # fmt: skip
        return Artifacts(
            phase=ArtifactsPhase.DONE,
            attempts=attempts,
            path=str(done.path),
            files=done.files,
            bytes=done.bytes,
            retrieved=utcnow(),
        )

    # --- stops ----------------------------------------------------------------------

    def request_snapshot(
        self,
        run_id: str,
        reason: SnapshotReason,
        asked_by: str,
        now: datetime,
        *,
        only_if_none_open: bool = False,
    ) -> StopState:
        """Asks the run's job for a snapshot: opens the stop (its proof deadline in the
        deadline table first), then writes the request; schedules the proof countdown
        for a new stop. Asking again changes only the reason, never the timers; with
        `only_if_none_open` (a policy) it changes nothing at all: the first reason
        stays and the open stop is returned as it is.

        Raises:
            NotFound, NotStarted, NotRunning, NoSnapshots, ExecError, StoreError.
        """
        run = self.store.get_run(run_id)
        check_snapshot_request(run)
        executor = self.executor(run.target)
        if only_if_none_open:
            # A request already in the run directory (the watchdog's, a person's) that
            # no tick has seen yet is the first one: noticed as the tick would, its
            # reason kept, nothing written over it. (A request written between this
            # read and the write below is replaced: a window of one round trip.)
            written = executor.read_from(f"{run.remote_dir}/{SNAPSHOT_REQUEST}", 0, 256)
            if written.strip():
                self.notice_request(run, written.decode("utf-8", "replace"), now)
                found = self.store.get_stop(run_id)
                if found is not None:
                    return found
        stop, opened = self.store.open_stop(
            run_id,
            reason,
            asked_by,
            now,
            self.settings.proof_timeout_s,
            replace_reason=not only_if_none_open,
        )
        if not opened and only_if_none_open:
            return stop
        try:
            executor.put_file(f"{run.remote_dir}/{SNAPSHOT_REQUEST}", str(stop.reason))
        except ExecError:
            if opened:
                # Never asked: a proof deadline would cancel a job that was not told.
                self.store.close_stop(run_id, stop.stop_id, note="the request could not be written")
            raise
        if opened:
            self.schedule_deadline(stop, "proof", self.settings.proof_timeout_s)
            log.info("run %s: snapshot asked (%s, by %s)", run_id, stop.reason, asked_by)
        return stop

    # --- policies -------------------------------------------------------------------

    def policy_target(self, target: str, now: datetime) -> dict[str, int]:
        """Evaluates the policies of every followed, running run of `target` that reads
        snapshot requests and has no open stop (DESIGN.md §7): the time policies from
        the record alone; the disk policy from one read-only probe of the target, at
        most once per `disk_probe_s`. Each verdict is published as a
        `runwarden.snapshot_request` event with `only_if_none_open` (a policy is a
        producer: an open stop is never asked again, its first reason stays).
        Returns how many runs it looked at and how many it asked."""
        ids = self.store.followed(target)
        runs = [
            r
            for r in self._records(ids)
            if r is not None
            and r.job is not None
            and r.state is RunState.RUNNING
            and r.snapshots
            and self.store.get_stop(r.id) is None
        ]
        verdicts: dict[str, PolicyVerdict] = {}
        for run in runs:
            verdict = time_verdict(
                run,
                now,
                lead_s=self.settings.deadline_lead_s,
                cost_fraction=self.settings.cost_fraction,
            )
            if verdict is not None:
                verdicts[run.id] = verdict
        watched = [r for r in runs if r.limits.disk and r.id not in verdicts]
        if watched and self.store.once(f"probe:{target}", ttl_s=self.settings.disk_probe_s):
            verdicts.update(self._disk_verdicts(target, watched))
        for run_id, verdict in verdicts.items():
            # One event per run per tick at most; the request task decides.
            if not self.store.once(f"policy:{run_id}", ttl_s=self.settings.policy_s):
                continue
            log.warning(
                "run %s: policy asks a snapshot (%s): %s", run_id, verdict.reason, verdict.why
            )
            body = {
                "run_id": run_id,
                "reason": str(verdict.reason),
                "asked_by": f"policy:{verdict.reason}",
                "only_if_none_open": True,
            }
            try:
                self.schedule(TASK_SNAPSHOT_REQUEST, {"body": body}, 0.0)
            except Exception:  # noqa: BLE001 - the next tick asks again
                self.store.forget(f"policy:{run_id}")
                log.warning("run %s: cannot publish the policy's request", run_id)
        return {"runs": len(runs), "asked": len(verdicts)}

    def _disk_verdicts(self, target: str, runs: list[RunRecord]) -> dict[str, PolicyVerdict]:
        """The disk policy's verdicts for `runs` of `target`, from one probe; a run
        whose directory could not be probed gets none (logged)."""
        token = _secrets.token_hex(16)
        try:
            output = self.executor(target).probe(
                disk_probe_script([r.remote_dir for r in runs], token)
            )
            samples = parse_disk_probe(output, token, len(runs))
        except (ExecError, WorkerError, ValueError) as error:
            log.warning("target %s: disk probe failed: %s", target, error)
            return {}
        found: dict[str, PolicyVerdict] = {}
        for run, sample in zip(runs, samples, strict=True):
            if isinstance(sample, Exception):
                log.warning("run %s: disk probe: %s", run.id, sample)
                continue
            why = disk_verdict(
                sample,
                used_limit=self.settings.disk_used_fraction,
                checkpoint_factor=self.settings.disk_checkpoint_factor,
            )
            if why is not None:
                found[run.id] = PolicyVerdict(SnapshotReason.DISK, why)
        return found

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
        message lost), and sends the retrieval task of every retrieval that is due
        (a first one whose task was lost, or the next attempt after a failure);
        returns how many deadlines it acted on."""
        for run_id in self.store.due_retrievals(now, limit):
            # Moved ahead first, so the next tick does not send it again while it
            # waits in the queue; the task moves it on when it runs.
            self.store.schedule_retrieval(run_id, now + timedelta(seconds=RETRIEVE_RESEND_S))
            self._send_retrieve(run_id)
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
