"""The wrapper's word on a job's end beyond its exit code (`.runwarden/ended`): the
signal its code stands for and the run's leftover processes, read once at the end
into the run's message (`schemas.run.decide_outcome`)."""

from __future__ import annotations

import logging

from schemas import JobStatus, RunRecord
from schemas.job import JobEnd, parse_job_end
from schemas.protocol import END_FILE, END_LIMIT

from .executors import ExecError, Executor, ProtocolError

log = logging.getLogger("runwarden")

__all__ = ["read_job_end"]


def read_job_end(
    executor: Executor, run: RunRecord, status: JobStatus, content: bytes | None = None
) -> JobEnd | None:
    """The run's [`JobEnd`], read (at most its first 256 bytes; `content` when the
    follow tick read it already) only for a job that exited: the wrapper writes it
    just before `exit_code`. None when the job did not exit, when the file is absent
    or not a regular file, or when the target could not be read (logged): the outcome
    then only lacks those words."""
    if status.kind != "exited":
        return None
    if content is not None:
        return parse_job_end(content)
    try:
        content = executor.read_from(f"{run.remote_dir}/{END_FILE}", 0, END_LIMIT)
    except ProtocolError:
        return None
    except ExecError as error:
        log.warning("run %s: cannot read how its job ended: %s", run.id, error)
        return None
    return parse_job_end(content)
