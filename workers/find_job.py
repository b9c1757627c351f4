"""How a launch's job is found again from its run directory alone, by a launch
delivered again or by `workers.reconcile` settling a launch whose worker died: the
lock a launch holds, the claim it leaves, the job it started.

A launch holds the lock of its idempotency key while it works (`launch:<key>` in the
store, kept alive by a heartbeat); its run directory's `.claim` holds an owner
derived from the run id and the key, so a redelivered launch re-claims the same
directory. A job was started in that directory exactly when `job.pid` is there: the
launcher's wrapper writes it before the job's command runs, the spawn clears a stale
one, and the launch never uploads one (`PROTOCOL_FILES` are left out of the upload).
"""

from __future__ import annotations

import logging
from typing import Final

from pydantic import ValidationError

from schemas import JobId, RunRecord
from schemas.protocol import CANCEL_FILE, CANCELLING_FILE, CLAIM_FILE, EXIT_FILE, PID_FILE

from .context import Context
from .executors import Executor, find_marked_job

log = logging.getLogger("runwarden")

__all__ = [
    "DIED_MESSAGE",
    "LAUNCH_LEASE_S",
    "PROTOCOL_FILES",
    "claimed",
    "find_job",
    "follow_found",
    "launch_lock",
    "owner_of",
]

LAUNCH_LEASE_S: Final = 20.0
"""How long a launch's lock on its key lasts without its worker's heartbeat (every
quarter of it), in seconds. So the lock of a dead worker lapses 15 to 20 s after
its death: longer than the launcher's own wait for `job.pid` (10 s), so a spawn that
was under way when its worker died has shown its job by the time a redelivered
launch may look."""
DIED_MESSAGE: Final = "the worker died during the launch; no job started"
PROTOCOL_FILES: Final = (PID_FILE, EXIT_FILE, CANCEL_FILE, CANCELLING_FILE, CLAIM_FILE)
"""Top-level names an upload never copies into a run directory: they would pass for
the marks of a job, or of another run's claim."""
_PID_LIMIT: Final = 32
_CLAIM_LIMIT: Final = 512


def launch_lock(key: str | None, run_id: str = "") -> str:
    """The name of the lock a launch holds while it works: `launch:<key>`; for a run
    created without a key (by an earlier version), `launch-run:<run_id>`."""
    return f"launch:{key}" if key is not None else f"launch-run:{run_id}"


def owner_of(run_id: str, key: str) -> str:
    """The claim owner of run `run_id` launched with key `key` (one line)."""
    return f"{run_id} {key}"


def find_job(executor: Executor, run_dir: str, mark: str | None = None) -> JobId | None:
    """The job started in `run_dir`, or None when there is none (or its `job.pid`
    holds no valid pid).

    With the run's mark (`RunRecord.job_mark`: every process of the job carries it,
    `schemas.protocol.mark_entry`), the job is first looked for among the target's
    processes (`find_marked_job`): found so, it has its leader's start time and its
    mark, as the spawn would have answered, so its status and cancel never trust its
    files (a job may rewrite `job.pid`, forge `exit_code`, put a link in place of
    `cancelled`). Only when no such process lives (the job ended, or the target has
    no `/proc`) is `job.pid` read (at most 32 bytes); that job keeps the mark.

    Raises:
        ExecError: the target cannot be read.
    """
    if mark is not None:
        found = find_marked_job(executor, mark)
        if found is not None:
            return JobId(dir=run_dir, pid=found[0], start=found[1], mark=mark)
    raw = executor.read_from(f"{run_dir}/{PID_FILE}", 0, _PID_LIMIT)
    try:
        pid = int(raw.decode("ascii", "replace").strip())
        return JobId(dir=run_dir, pid=pid, mark=mark)
    except (ValueError, ValidationError):
        return None


def claimed(executor: Executor, run: RunRecord, key: str | None) -> bool:
    """Whether the run directory of `run` is claimed by it: its `.claim` (at most 512
    bytes read) holds the run's owner (`owner_of`); for a run without a key, an owner
    starting with its id.

    Raises:
        ExecError: the target cannot be read.
    """
    raw = executor.read_from(f"{run.remote_dir}/{CLAIM_FILE}", 0, _CLAIM_LIMIT)
    line = raw.decode("utf-8", "replace").split("\n", 1)[0]
    if key is not None:
        return line == owner_of(run.id, key)
    return line.split(" ", 1)[0] == run.id


def follow_found(
    ctx: Context, executor: Executor, run: RunRecord, job: JobId, why: str
) -> RunRecord:
    """Records the `preparing` run `run` running with the `job` found in its run
    directory and follows it (one step, `RunStore.launches.start`); returns the record. A
    job that already ended is recorded the same way: the next watch tick records its
    end from its run directory (its exit code, cancel or loss), as for any job.

    Raises:
        ExecError: the job's status cannot be read. Conflict, StoreError.
    """
    status = executor.status(job)
    record, _ = ctx.store.launches.start(run.id, job)
    log.warning("run %s: %s; its job (pid %s) is %s: following it", run.id, why, job.pid, status)
    return record
