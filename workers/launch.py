"""Starting runs: launch (with resume from a stopped run's checkpoint), adopting a run
directory started elsewhere, and following a recorded run again."""

from __future__ import annotations

import logging
import os
import secrets as _secrets
from datetime import datetime
from pathlib import Path

from pydantic import SecretStr

from schemas import (
    JobCommand,
    JobId,
    NotResumable,
    RunRecord,
    RunState,
    new_run_id,
    next_run_id,
    validate_run_id,
)
from schemas.events import LaunchSpec
from schemas.policy import deadline_request_after_s
from schemas.protocol import (
    JOBSIDE_DIR,
    METRICS_ENV,
    METRICS_FILE,
    PID_FILE,
    REQUEST_ENV,
    RESUME_ENV,
    RUN_ID_ENV,
    SECRET_ENV_PREFIX,
    SNAPSHOT_REQUEST,
)
from schemas.run import ADOPTED_COMMAND, check_resumable

from .context import Context
from .errors import LaunchError, RetrievalError, SecretMissing
from .executors import Executor, FileDigest
from .jobside import jobside_dir
from .retrieval import check_stored

log = logging.getLogger("runwarden")

__all__ = ["CLAIM_TRIES", "adopt", "follow_again", "launch", "resumable"]

CLAIM_TRIES = 20
"""Run ids tried (the next one after a taken directory) before a launch gives up."""


def _secrets_of(spec: LaunchSpec) -> dict[str, SecretStr]:
    """The values of the secrets `spec` names, from the worker's environment.

    Raises:
        SecretMissing: naming the first one that is not set.
    """
    found = {}
    for name in spec.secrets:
        value = os.environ.get(SECRET_ENV_PREFIX + name)
        if value is None:
            raise SecretMissing(name)
        found[name] = SecretStr(value)
    return found


def _claim(
    ctx: Context, executor: Executor, spec: LaunchSpec, now: datetime, resumed: str | None
) -> str:
    """Records a new run `preparing` and claims its run directory; a directory already
    taken tries the next id. Returns the run id.

    Raises:
        LaunchError: when no free directory was found.
    """
    run_id = new_run_id(spec.name, now)
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
            resumed_from=resumed,
        )
        if ctx.store.create_run(record):
            if executor.claim(run_dir, f"{run_id} {_secrets.token_hex(8)}"):
                return run_id
            ctx.store.transition(run_id, RunState.FAILED, message="run directory taken")
        run_id = next_run_id(run_id)
    raise LaunchError(f"no free run directory after {CLAIM_TRIES} tries")


def launch(ctx: Context, spec: LaunchSpec, now: datetime) -> RunRecord:
    """Claims a run directory (a taken one tries the next id), records the run,
    uploads, ships the job side, spawns (with the on-target watchdog when the run has
    `max_hours` and reads snapshot requests), records it running and follows it. If
    the record cannot be written after the spawn, the job is cancelled: nothing could
    find it again.

    A resume (`spec.resume_from`) first checks that the run is stopped and its
    checkpoint is intact in the artifact store (else `NotResumable`, nothing claimed),
    then uploads that checkpoint to the same relative path in the new run directory,
    checks the upload against the stored manifest, and passes its absolute path as
    `RUNWARDEN_RESUME_FROM`. The spawn removes a stale `snapshot.request` or
    `snapshot.json` (from the uploaded directory), so the new run never inherits a
    request.

    Raises:
        UnknownTarget, NotFound, NotResumable, LaunchError, SecretMissing,
        ExecError, StoreError.
    """
    resume = None if spec.resume_from is None else resumable(ctx, spec.resume_from)
    secrets = _secrets_of(spec)
    executor = ctx.executor(spec.target)
    run_id = _claim(ctx, executor, spec, now, None if resume is None else resume[0].id)
    run_dir = f"{executor.workdir}/{run_id}"
    try:
        if spec.upload is not None:
            executor.upload(spec.upload, run_dir, spec.skip)
        executor.upload(jobside_dir(), f"{run_dir}/{JOBSIDE_DIR}", ["__init__.py", "__pycache__"])
        env = {
            "PYTHONPATH": f"{run_dir}/{JOBSIDE_DIR}",
            RUN_ID_ENV: run_id,
            REQUEST_ENV: f"{run_dir}/{SNAPSHOT_REQUEST}",
            METRICS_ENV: f"{run_dir}/{METRICS_FILE}",
        }
        if resume is not None:
            env[RESUME_ENV] = _upload_checkpoint(ctx, executor, run_dir, resume)
        after_s = deadline_request_after_s(spec.limits, ctx.settings.deadline_lead_s)
        job = executor.spawn(
            JobCommand(
                dir=run_dir,
                script=spec.command,
                env=env,
                secrets=secrets,
                deadline_request_after_s=(
                    None if after_s is None or not spec.snapshots else max(after_s, 0.001)
                ),
                watchdog_poll_s=ctx.settings.watchdog_poll_s,
            )
        )
    except Exception as error:
        # Also the task's soft time limit (an Exception): a run never stays `preparing`.
        text = str(error) or type(error).__name__
        try:
            ctx.store.transition(run_id, RunState.FAILED, message=f"launch failed: {text}")
        except Exception:
            log.exception("run %s: cannot record its failed launch", run_id)
        raise
    try:
        record = ctx.store.transition(run_id, RunState.RUNNING, job=job)
        ctx.store.follow(run_id)
    except Exception:
        log.exception("run %s: cannot record its job; cancelling it", run_id)
        executor.cancel(job)
        raise
    log.info("run %s: launched on %s, pid %s", run_id, spec.target, job.pid)
    return record


def resumable(ctx: Context, run_id: str) -> tuple[RunRecord, str, list[FileDigest]]:
    """The stopped run `run_id`, its checkpoint (relative to the run directory) and the
    stored digests of the checkpoint's files, when it can be resumed.

    Raises:
        NotFound: no such run.
        NotResumable: it is not stopped, or its checkpoint is not complete in the
            artifact store (not retrieved yet, retrieval failed, files missing or
            changed in size).
    """
    source = ctx.store.get_run(run_id)
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
    local: Path = ctx.settings.artifacts_root / source.id / checkpoint
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


def adopt(ctx: Context, target: str, run_dir: str, now: datetime) -> RunRecord:
    """Follows a run directory started elsewhere (by hand, or by overbrainer): its pid
    from `job.pid`; its id from the directory's name when that is a free run id, else
    a new one.

    Raises:
        LaunchError: when the directory holds no usable `job.pid`.
    """
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
    while not ctx.store.create_run(record):
        record = record.model_copy(update={"id": next_run_id(record.id)})
    ctx.store.follow(record.id)
    return record


def follow_again(ctx: Context, run_id: str) -> RunRecord:
    """Follows the recorded run `run_id` again when it has a job and has not ended;
    returns its record. A run that ended, or has no job yet, is left as it is.

    Raises:
        NotFound, StoreError.
    """
    run = ctx.store.get_run(run_id)
    if run.job is not None and not run.state.is_terminal:
        ctx.store.follow(run.id)
    return run
