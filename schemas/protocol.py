"""Names of the on-target protocol (docs/protocol.md): the files of a run directory,
identical to those of overbrainer (the tool the protocol comes from) so either tool can
follow and stop a run started by the other, and the variables of the job's
environment.

Every name is relative to the run directory `<workdir>/<run_id>`.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

__all__ = [
    "CANCELLING_FILE",
    "CANCEL_FILE",
    "CGROUP_PARENT",
    "CLAIM_FILE",
    "END_FILE",
    "END_LIMIT",
    "EXIT_FILE",
    "FILTERED_ENV_PREFIXES",
    "JOBSIDE_DIR",
    "JOB_LOG",
    "MARK_ENV",
    "MARK_FORM",
    "MAX_TAIL_READ",
    "METRICS_ENV",
    "METRICS_FILE",
    "NOTICE_FILE",
    "NOTICE_PID_FILE",
    "NOTICE_STATE_FILE",
    "OUTPUT_DIR",
    "PID_FILE",
    "PROOF_LIMIT",
    "REQUEST_ENV",
    "RESUME_ENV",
    "RUN_AS_PATH",
    "RUN_ID_ENV",
    "SECRET_ENV_PREFIX",
    "SNAPSHOT_FILE",
    "SNAPSHOT_REQUEST",
    "check_run_cgroup",
    "mark_entry",
    "new_mark",
    "user_environment",
]

JOB_LOG: Final = "job.log"
"""The job's stdout and stderr, appended."""
PID_FILE: Final = "job.pid"
"""Pid of the job's session and process-group leader, written first by the wrapper."""
END_FILE: Final = ".runwarden/ended"
"""How the job's main process ended beyond its code, written by the wrapper just before
`exit_code`: `signal <NAME>` (a code above 128), then `leftovers <N>`, `survived <N>`
or `waited <N>` (the run's processes left when its main process ended: see
docs/protocol.md, "Spawn"). runwarden adds it; a reader without it loses only words
of the run's message."""
END_LIMIT: Final = 256
"""Largest prefix of [`END_FILE`] read from the target, in bytes."""
EXIT_FILE: Final = "exit_code"
"""The job script's exit code, written last by the wrapper."""
CANCELLING_FILE: Final = "cancelling"
"""Marker written by cancel before anything is signalled."""
CANCEL_FILE: Final = "cancelled"
"""Marker written by cancel once the process group is gone; wins over everything."""
CLAIM_FILE: Final = ".claim"
"""Created exclusively by claim; holds the owner value of the run (one line)."""
SNAPSHOT_REQUEST: Final = "snapshot.request"
"""A snapshot was asked for; holds the reason."""
SNAPSHOT_FILE: Final = "snapshot.json"
"""The proof that a snapshot was saved, written by the job's plugin."""
OUTPUT_DIR: Final = "output"
"""Where the trainer saves `checkpoint-<step>` directories."""
METRICS_FILE: Final = "metrics.jsonl"
"""One JSON object a line, written by the job's plugin: `begin`, `log`, `end`."""
JOBSIDE_DIR: Final = ".runwarden"
"""Where launch ships the stdlib-only job-side files; on the job's `PYTHONPATH`."""
NOTICE_FILE: Final = "notice.json"
"""The cloud's preemption notice, written by the on-target notice watcher (runwarden
adds; `workers/executors/notices.py`) before it writes `snapshot.request`."""
NOTICE_STATE_FILE: Final = f"{JOBSIDE_DIR}/notice.state"
"""One line: what the notice watcher does (`watching ...`, `unavailable: ...`,
`done: ...`)."""
NOTICE_PID_FILE: Final = f"{JOBSIDE_DIR}/notice.pid"
"""The notice watcher's pid (like `watchdog.pid`)."""

# --- the job's environment -------------------------------------------------------------
# The job side (`workers/jobside/runwarden_job.py`, stdlib only) repeats these names;
# a test pins that they agree.

RUN_ID_ENV: Final = "RUNWARDEN_RUN_ID"
"""The job's variable holding its run id (the mark of a run launched before
[`MARK_ENV`])."""
MARK_ENV: Final = "RUNWARDEN_MARK"
"""The job's variable holding its run's mark ([`new_mark`]): how cancel, the job's
wrapper and a launch whose spawn answer was lost find the run's processes. A random
token per run, never the run id alone: two services on one machine may give two runs
the same id, and one's cancel must never sweep the other's job."""
MARK_FORM: Final = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
"""What a mark may be (`JobId.mark`): a token of [`new_mark`], or a run id."""
_TOKEN: Final = re.compile(r"[0-9a-f]{32}")


def new_mark() -> str:
    """A fresh run mark: 32 random hexadecimal digits (128 bits)."""
    return secrets.token_hex(16)


CGROUP_PARENT: Final = "runwarden"
"""The directory of a cgroup v2 hierarchy that holds one cgroup per run, named by the
run's mark (`workers.cgroups`)."""
_RUN_CGROUP: Final = re.compile(r"(?:/[^/\0]+)*/" + CGROUP_PARENT + r"/[0-9a-f]{32}")


def check_run_cgroup(path: str) -> str:
    """`path` when it is a run's cgroup, `<hierarchy>/runwarden/<mark>` (a mark of
    [`new_mark`]), absolute, with no `.` or `..` part; else `ValueError`. A cancel
    ends every process of the cgroup it is given (SIGTERM to each, `cgroup.kill`), as
    root: never any other directory, whatever a record in Redis says."""
    parts = path.split("/")
    if not _RUN_CGROUP.fullmatch(path) or "." in parts or ".." in parts:
        raise ValueError(f"not a run's cgroup (<hierarchy>/{CGROUP_PARENT}/<mark>): {path[:200]!r}")
    return path


def mark_entry(mark: str) -> str:
    """The exact environment entry that carries `mark` in a run's processes:
    `RUNWARDEN_MARK=<mark>` for a mark made by [`new_mark`]; `RUNWARDEN_RUN_ID=<mark>`
    for any other (a run id: the mark of a run launched before marks, which has no
    `-` free 32-digit hex form)."""
    return f"{MARK_ENV if _TOKEN.fullmatch(mark) else RUN_ID_ENV}={mark}"


REQUEST_ENV: Final = "RUNWARDEN_SNAPSHOT_REQUEST"
"""The job's variable holding the absolute path of `snapshot.request`."""
METRICS_ENV: Final = "RUNWARDEN_METRICS"
"""The job's variable holding the absolute path of `metrics.jsonl`."""
RESUME_ENV: Final = "RUNWARDEN_RESUME_FROM"
"""The job's variable naming the checkpoint (absolute path on the target) a resumed
run continues from."""
SECRET_ENV_PREFIX: Final = "RUNWARDEN_SECRET_"  # noqa: S105 - a name prefix, not a secret
"""With `RUNWARDEN_SECRETS_FROM_ENV`, a secret `NAME` a launch names that has no file
in the secrets directory is read on the worker from `RUNWARDEN_SECRET_NAME`."""
FILTERED_ENV_PREFIXES: Final = ("RUNWARDEN_", "OVERBRAINER_", "VAULT_")
"""A local job never inherits a variable whose name starts with one of these: they
hold the service's own configuration and credentials."""

PROOF_LIMIT: Final = 64 * 1024
"""Largest prefix of `snapshot.json` read from the target, in bytes."""
MAX_TAIL_READ: Final = 1024 * 1024
"""Largest read of one tail poll, in bytes: a longer line is emitted cut."""


RUN_AS_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
"""`PATH` of a script or job run as another user (the job may set its own)."""


def user_environment(name: str, home: str) -> dict[str, str]:
    """The least environment of a script or job run as the user `name` whose home is
    `home` (docs/protocol.md, "Jobs run as another user"): `PATH` ([`RUN_AS_PATH`]),
    `HOME`, `USER` and `LOGNAME`, `SHELL` (`/bin/sh`). Nothing of the worker's."""
    return {"PATH": RUN_AS_PATH, "HOME": home, "USER": name, "LOGNAME": name, "SHELL": "/bin/sh"}
