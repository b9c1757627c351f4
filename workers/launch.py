"""Starting runs: launch, exactly once per idempotency key (with resume from a stopped
run's checkpoint), adopting a run directory started elsewhere, and following a
recorded run again. How its job is found again from its run directory
alone is `workers.find_job`'s, which `workers.reconcile` uses too.

Exactly once: a launch works under the lock of its key (`LaunchSpec.key`, else one
derived from its message), and the store maps the key to the run it created, in the
step that creates the record. A launch delivered again (its worker was killed, the
broker redelivered the message) takes the lock (a dead worker's lapses within
`LAUNCH_LEASE_S`), finds its run, and goes on from where it stopped: a run that is
running or ended is returned as it is; a `preparing` run whose job started (`job.pid`
in its run directory) is recorded running and followed; one whose job did not start
is launched on (the uploads overwrite, the spawn clears stale files). Never two jobs,
never a job nobody follows.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Final

from schemas import (
    Conflict,
    JobCommand,
    JobId,
    NotResumable,
    RunRecord,
    RunState,
    RunwardenError,
    TargetConfig,
    new_run_id,
    next_run_id,
    validate_run_id,
)
from schemas.chain import is_preempted
from schemas.events import LaunchSpec
from schemas.idempotency import new_launch_key
from schemas.policy import deadline_request_after_s
from schemas.protocol import (
    JOBSIDE_DIR,
    MARK_ENV,
    METRICS_ENV,
    METRICS_FILE,
    PID_FILE,
    REQUEST_ENV,
    RESUME_ENV,
    RUN_ID_ENV,
    SNAPSHOT_REQUEST,
    new_mark,
)
from schemas.run import ADOPTED_COMMAND, check_resumable

from .cgroups import run_cgroup
from .context import Context
from .errors import LaunchError, RetrievalError
from .executors import (
    ExecError,
    Executor,
    FileDigest,
    InvalidArgument,
    InvalidSecret,
)
from .find_job import (
    LAUNCH_LEASE_S,
    PROTOCOL_FILES,
    find_job,
    follow_found,
    launch_lock,
    owner_of,
)
from .jobside import jobside_dir
from .lease import Lease, leased
from .permits import Permit, check_launch
from .preemption import notice_command, watched
from .retrieval import check_stored

log = logging.getLogger("runwarden")

__all__ = [
    "CLAIM_TRIES",
    "LAUNCH_WAIT_S",
    "SPAWN_WINDOW_S",
    "adopt",
    "follow_again",
    "launch",
    "resumable",
]

CLAIM_TRIES = 20
"""Run ids tried (the next one after a taken directory) before a launch gives up."""
LAUNCH_WAIT_S: Final = 1.5 * LAUNCH_LEASE_S
"""How long a launch waits for its key's lock: long enough for the lock of a dead
worker to lapse. A lock still held then is a live launch's (a duplicate message)."""
SPAWN_WINDOW_S: Final = 12.0
"""After a spawn failed without an answer (a timeout, a broken connection), how long
after its start the launch keeps looking for `job.pid` before it decides no job
started, in seconds: the launcher waits 10 s for the job to write it."""

_Resume = tuple[RunRecord, str, list[FileDigest]]


def _record_failed(ctx: Context, run_id: str, message: str, job: JobId | None = None) -> None:
    """Records the launch of `run_id` failed; a failure to record is logged only (the
    run stays `preparing`, and `settle_launches` settles it)."""
    try:
        ctx.store.runs.transition(run_id, RunState.FAILED, message=message, job=job)
    except Exception:
        log.exception("run %s: cannot record its failed launch", run_id)


def _claim(
    ctx: Context,
    executor: Executor,
    spec: LaunchSpec,
    *,
    now: datetime,
    source: RunRecord | None,
    key: str,
    target: TargetConfig,
) -> RunRecord:
    """Records a new run `preparing`, its key mapped to it, and claims its run
    directory; a directory already taken fails that run and tries the next id (the
    key moves to it). Returns the record. A resume of `source` links to it and counts
    the preemptions of its chain (`schemas.chain`).

    Raises:
        LaunchError: when no free directory was found. ExecError: the claim failed
            (the run is recorded failed).
    """
    run_id, replaces = new_run_id(spec.name, now), None
    for _ in range(CLAIM_TRIES):
        record = RunRecord(
            id=run_id,
            target=spec.target,
            created=now,
            remote_dir=f"{executor.workdir}/{run_id}",
            state=RunState.PREPARING,
            snapshots=spec.snapshots,
            command=spec.command,
            limits=spec.limits,
            timeouts=spec.timeouts,
            name=spec.name,
            labels=spec.labels,
            upload=None if spec.upload is None else str(spec.upload),
            skip=spec.skip,
            secrets=spec.secrets,
            resumed_from=None if source is None else source.id,
            on_preempt=spec.on_preempt,
            chain_preemptions=0
            if source is None
            else source.chain_preemptions + is_preempted(source.snapshot),
            preemption=watched(spec, target),
            preemption_mode=spec.preemption,
            wait_for_all=spec.wait_for_all,
            mark=new_mark(),
        )
        if ctx.store.runs.create(record, key=key, replaces=replaces):
            try:
                taken = not executor.claim(record.remote_dir, owner_of(run_id, key))
            except ExecError as error:
                _record_failed(ctx, run_id, f"launch failed: {error}")
                raise
            if not taken:
                return record
            ctx.store.runs.transition(run_id, RunState.FAILED, message="run directory taken")
            replaces = run_id
        run_id = next_run_id(run_id)
    raise LaunchError(f"no free run directory after {CLAIM_TRIES} tries")


def launch(ctx: Context, spec: LaunchSpec, now: datetime, key: str | None = None) -> RunRecord:
    """Launches `spec` once for the key `key` (the task gives the key of its producer,
    `schemas.idempotency.owned_launch_key`, of `spec.key` or of one derived from the
    message; else `spec.key`, else a random one): claims a run directory (a taken
    one tries the next id), records the run, uploads, ships the job side, spawns
    (with the on-target watchdog when the run has `max_hours` and reads snapshot
    requests), records it running and follows it (one step). Returns the run.

    Delivered again with the same key, it finds the run it started and goes on from
    there (module docstring), unless that run is another launch's (another target,
    command, name or source run: `LaunchError`, nothing changed); while another
    launch of the key is at work (a
    duplicate message), it returns that run as it stands (`preparing`), or raises
    `LaunchError` when that launch has not created it yet.

    A spawn that fails without an answer (a timeout, a broken connection) looks for
    the job in the run directory for up to `SPAWN_WINDOW_S` after the spawn began: a
    job found is followed; none recorded the run failed; a target that cannot be
    read leaves the run `preparing` for `settle_launches`. A launch abandoned during
    the spawn (its soft time limit) cancels a job it finds and records the run failed.
    If the record cannot be written after the spawn, the job is cancelled.

    A resume (`spec.resume_from`) first checks that the run is stopped and its
    checkpoint is intact in the artifact store (else `NotResumable`, nothing claimed),
    then uploads that checkpoint to the same relative path in the new run directory,
    checks the upload against the stored manifest, and passes its absolute path as
    `RUNWARDEN_RESUME_FROM`. The spawn removes a stale `snapshot.request` or
    `snapshot.json` (from the uploaded directory), so the new run never inherits a
    request; the upload never copies `PROTOCOL_FILES`.

    Raises:
        UnknownTarget, NotFound, NotResumable, LaunchError, SecretMissing,
        ExecError, StoreError.
    """
    key = key or spec.key or new_launch_key()
    with leased(ctx.store.locks, launch_lock(key), LAUNCH_LEASE_S, LAUNCH_WAIT_S) as lease:
        if lease is None:
            run_id = ctx.store.launches.launch(key)
            if run_id is None:
                raise LaunchError(f"a launch with key {key!r} is at work on another worker")
            log.info("run %s: its launch (key %s) is at work on another worker", run_id, key)
            return _same_launch(ctx.store.runs.get(run_id), spec, key)
        return _launch(ctx, spec, now, key, lease)


def _same_launch(run: RunRecord, spec: LaunchSpec, key: str) -> RunRecord:
    """`run`, the run `key` started, when `spec` is the launch that started it.

    Raises:
        LaunchError: the key started it for another launch (saying what differs).
    """
    differs = [
        name
        for name, mine, theirs in (
            ("target", spec.target, run.target),
            ("command", spec.command, run.command),
            ("name", spec.name, run.name),
            ("resume_from", spec.resume_from, run.resumed_from),
        )
        if mine != theirs
    ]
    if differs:
        raise LaunchError(
            f"launch key {key!r} already started run {run.id} for another launch (its "
            f"{', '.join(differs)} differ): give this launch a key of its own"
        )
    return run


def _launch(ctx: Context, spec: LaunchSpec, now: datetime, key: str, lease: Lease) -> RunRecord:
    """`launch` under the lock of `key`."""
    run_id = ctx.store.launches.launch(key)
    if run_id is None:
        resume = None if spec.resume_from is None else resumable(ctx, spec.resume_from)
        permit = check_launch(ctx, spec)
        executor = ctx.executor_for(permit.target)
        source = None if resume is None else resume[0]
        run = _claim(ctx, executor, spec, now=now, source=source, key=key, target=permit.target)
    else:
        run = _same_launch(ctx.store.runs.get(run_id), spec, key)
        if run.state is not RunState.PREPARING:
            log.info("run %s: its launch (key %s) came again; it is %s", run.id, key, run.state)
            return follow_again(ctx, run.id)
        # A target that cannot be reached here leaves the run `preparing` (its job may
        # have started): the next delivery, or `settle_launches`, looks again.
        executor = ctx.executor(run.target)
        if not executor.claim(run.remote_dir, owner_of(run.id, key)):
            message = f"the run directory {run.remote_dir} is claimed by another"
            _record_failed(ctx, run.id, f"launch failed: {message}")
            raise LaunchError(message)
        job = find_job(executor, run.remote_dir, run.job_mark)
        if job is not None:
            return follow_found(ctx, executor, run, job, "its launch came again")
        log.warning("run %s: its launch came again before its job started: going on", run.id)
        try:
            resume = None if spec.resume_from is None else resumable(ctx, spec.resume_from)
            permit = check_launch(ctx, spec)
        except RunwardenError as error:
            _record_failed(ctx, run.id, f"launch failed: {error}")
            raise
    command = _prepare(ctx, executor, spec, run, resume=resume, permit=permit)
    if not lease.held:
        raise LaunchError(f"run {run.id}: the launch lost its lock before the spawn; not spawned")
    job = _spawn(ctx, executor, run, command)
    try:
        record, _ = ctx.store.launches.start(run.id, job)
    except Exception:
        log.exception("run %s: cannot record its job; cancelling it", run.id)
        executor.cancel(job)
        raise
    log.info("run %s: launched on %s, pid %s", run.id, run.target, job.pid)
    return record


def _prepare(
    ctx: Context,
    executor: Executor,
    spec: LaunchSpec,
    run: RunRecord,
    *,
    resume: _Resume | None,
    permit: Permit,
) -> JobCommand:
    """Uploads the project and the job side (and a resume's checkpoint) into the run
    directory; returns the job to spawn. Any error records the run failed (nothing
    was started) and is raised."""
    run_dir = run.remote_dir
    try:
        if permit.upload is not None:
            executor.upload(permit.upload, run_dir, [*spec.skip, *PROTOCOL_FILES])
        executor.upload(jobside_dir(), f"{run_dir}/{JOBSIDE_DIR}", ["__init__.py", "__pycache__"])
        env = {
            "PYTHONPATH": f"{run_dir}/{JOBSIDE_DIR}",
            RUN_ID_ENV: run.id,
            **({} if run.mark is None else {MARK_ENV: run.mark}),
            REQUEST_ENV: f"{run_dir}/{SNAPSHOT_REQUEST}",
            METRICS_ENV: f"{run_dir}/{METRICS_FILE}",
        }
        if resume is not None:
            env[RESUME_ENV] = _upload_checkpoint(ctx, executor, run_dir, resume)
        after_s = deadline_request_after_s(spec.limits, ctx.settings.deadline_lead_s)
        return JobCommand(
            dir=run_dir,
            script=spec.command,
            env=env,
            secrets=permit.secrets,
            deadline_request_after_s=(
                None if after_s is None or not spec.snapshots else max(after_s, 0.001)
            ),
            watchdog_poll_s=ctx.settings.watchdog_poll_s,
            wait_for_all=spec.wait_for_all,
            cgroup=run_cgroup(permit.target, run, ctx.settings, executor),
            **notice_command(ctx, run),
        )
    except Exception as error:
        # Also the task's soft time limit (an Exception): a run never stays `preparing`.
        _record_failed(ctx, run.id, f"launch failed: {str(error) or type(error).__name__}")
        raise


def _spawn(ctx: Context, executor: Executor, run: RunRecord, command: JobCommand) -> JobId:
    """Spawns `command`; returns its job, also one found after a spawn that failed
    without an answer (see `launch`).

    Raises:
        InvalidSecret, InvalidArgument: refused before anything ran (recorded failed).
        ExecError: the spawn failed and no job started (recorded failed), or the run
            directory could not be read after it (left `preparing`).
        Exception: the launch was abandoned (a job found is cancelled; recorded
            failed).
    """
    began = time.monotonic()
    try:
        return executor.spawn(command)
    except (InvalidSecret, InvalidArgument) as error:
        _record_failed(ctx, run.id, f"launch failed: {error}")
        raise
    except ExecError as error:
        try:
            job = _job_after_spawn(executor, run.remote_dir, began, run.job_mark)
        except ExecError as unread:
            log.error(
                "run %s: spawn failed (%s) and the run directory cannot be read (%s): left "
                "preparing, for reconcile to settle",
                run.id, error, unread,
            )  # fmt: skip
            raise error from unread
        if job is None:
            _record_failed(ctx, run.id, f"launch failed: {error}")
            raise
        log.warning("run %s: spawn failed (%s), but its job started", run.id, error)
        return job
    except Exception as error:
        text = str(error) or type(error).__name__
        try:
            job = find_job(executor, run.remote_dir, run.job_mark)
            if job is not None:
                executor.cancel(job)
        except ExecError:
            log.exception("run %s: launch abandoned during the spawn; left preparing", run.id)
            raise error from None
        suffix = "" if job is None else f"; its job (pid {job.pid}) was cancelled"
        _record_failed(ctx, run.id, f"launch failed: {text}{suffix}", job)
        raise


def _job_after_spawn(executor: Executor, run_dir: str, began: float, mark: str) -> JobId | None:
    """The job a spawn that began at `began` (monotonic) started (marked `mark`: see
    `find_job`), looked for until
    `SPAWN_WINDOW_S` after it (a broken connection may come back meanwhile); None
    when none started.

    Raises:
        ExecError: the run directory could not be read at the end of the window.
    """
    deadline = began + SPAWN_WINDOW_S
    while True:
        failure: ExecError | None = None
        try:
            job = find_job(executor, run_dir, mark)
            if job is not None:
                return job
        except ExecError as error:
            failure = error
        left = deadline - time.monotonic()
        if left <= 0:
            if failure is not None:
                raise failure
            return None
        time.sleep(min(1.0, left))


def resumable(ctx: Context, run_id: str) -> tuple[RunRecord, str, list[FileDigest]]:
    """The stopped run `run_id`, its checkpoint (relative to the run directory) and the
    stored digests of the checkpoint's files, when it can be resumed.

    Raises:
        NotFound: no such run.
        NotResumable: it is not stopped, or its checkpoint is not complete in the
            artifact store (not retrieved yet, retrieval failed, files missing or
            changed in size).
    """
    source = ctx.store.runs.get(run_id)
    checkpoint = check_resumable(source).checkpoint
    try:
        files = check_stored(ctx.settings.artifacts_root / source.id, checkpoint, source.id)
    except RetrievalError as error:
        raise NotResumable(run_id, str(error)) from error
    return source, checkpoint, files


def _upload_checkpoint(
    ctx: Context,
    executor: Executor,
    run_dir: str,
    resume: tuple[RunRecord, str, list[FileDigest]],
) -> str:
    """Uploads the stored checkpoint of `resume` (the source run, its checkpoint and the
    stored digests, as [`resumable`] gives them) to `<run_dir>/<checkpoint>` and checks
    every file against the stored digests; returns the remote path.

    Raises:
        LaunchError: the upload differs from the artifact store.
        ExecError: the upload failed.
    """
    source, checkpoint, files = resume
    # Opened as checked (`executors.uploadtree`): the store's own path, links resolved.
    local = Path(os.path.realpath(ctx.settings.artifacts_root / source.id / checkpoint))
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


def adopt(
    ctx: Context, target: str, run_dir: str, now: datetime, key: str | None = None
) -> RunRecord:
    """Follows a run directory started elsewhere (by hand, or by overbrainer): its pid
    from `job.pid`; its id from the directory's name when that is a free run id, else
    a new one. Once per `key` (the task gives its producer's key of the message, as a
    launch's: a redelivered adoption finds the run it made, and follows it again),
    none: every call adopts.

    Raises:
        LaunchError: when the directory holds no usable `job.pid`.
    """
    if key is not None:
        made = ctx.store.launches.launch(key)
        if made is not None:
            log.info("run %s: its adoption (key %s) came again", made, key)
            return follow_again(ctx, made)
    executor = ctx.executor(target)
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
    while True:
        try:
            if ctx.store.runs.create(record, key=key):
                break
        except Conflict:  # the same adoption, at work on another worker, made it first
            made = ctx.store.launches.launch(key) if key is not None else None
            if made is None:
                raise
            return follow_again(ctx, made)
        record = record.model_copy(update={"id": next_run_id(record.id)})
    ctx.store.follow.add(record.id)
    return record


def follow_again(ctx: Context, run_id: str) -> RunRecord:
    """Follows the recorded run `run_id` again when it has a job and has not ended;
    returns its record. A run that ended, or has no job yet, is left as it is.

    Raises:
        NotFound, StoreError.
    """
    run = ctx.store.runs.get(run_id)
    if run.job is not None and not run.state.is_terminal:
        ctx.store.follow.add(run.id)
    return run
